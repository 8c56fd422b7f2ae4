"""A load that passed the "is this subject erased?" check just before another process
destroyed the subject's keys (bug EX).

The loader asks the ledger first, then reads the stream. An erasure committed between
the two leaves every sealed row unreadable: the stream's first event (its creation) reads
as ``ContentShredded``, which has no aggregate to apply to. Before the fix that was the
event library's bare ``assert aggregate is not None``: an ``AssertionError`` naming
nothing (seen once in CI beside an erasure under load). The subject was erased, and the
caller must be told so.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from domain.errors import SubjectErasedError
from tests.kernel.conftest import consent, say
from uprof.kernel import Uprof


def erased_after_the_check(kernel: Uprof, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the loader's erased-check answer as it did just before the keys went."""
    monkeypatch.setattr(kernel.keystore, "is_shredded", lambda stream_id: False)


def test_a_load_racing_the_key_destruction_says_erased(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    consent(kernel)
    for i in range(3):
        kernel.capture("alice", say(f"I live in Lisbon and I like tea number {i}"))
    kernel.process_once()
    stream = kernel.stream_of("alice")
    kernel.erase_subject("alice")
    erased_after_the_check(kernel, monkeypatch)

    with pytest.raises(SubjectErasedError):
        kernel.app.load(stream)


def test_a_load_reading_a_snapshot_after_its_key_went_says_erased(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The erasure destroys the keys before it drops the snapshot rows: a load between
    the two reads a snapshot that no longer opens."""
    consent(kernel)
    kernel.capture("alice", say("I live in Lisbon and I like tea"))
    kernel.process_once()
    stream = kernel.stream_of("alice")
    kernel.app.take_snapshot(stream)
    kernel.keystore.destroy(str(stream), now=datetime(2025, 2, 1, tzinfo=UTC))
    erased_after_the_check(kernel, monkeypatch)

    with pytest.raises(SubjectErasedError):
        kernel.app.load(stream)
