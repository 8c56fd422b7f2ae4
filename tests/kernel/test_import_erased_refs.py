"""An import never brings back a capture erased at the subject's request (I9), however late.

Bug IC: a re-import skipped an erased capture's record only while the subject's stream
still held the record's retry token (the idempotency retention, 24 h by default): the
captures view, which matches ``source_ref``, loses the erased capture with the rest of its
derived data. A day later the same file (an old export, a nightly sync) captured the
erased words again, reported as a plain new capture.
"""

from __future__ import annotations

import pytest

from tests.fakes.ports import FakeClock
from tests.kernel.conftest import consent
from tests.kernel.test_idempotency import captured
from tests.kernel.test_import_idempotency import record
from uprof.kernel import Uprof
from uprof.services.importer import import_interactions


@pytest.mark.xfail(
    strict=True,
    reason="bug IC, left open (decision 0144-import-and-adapters-attacks): the stream "
    "forgets an erased capture's ref token after the idempotency retention",
)
def test_an_erased_capture_stays_erased_after_the_retention_window(
    kernel: Uprof, clock: FakeClock
) -> None:
    consent(kernel)
    lines = [record("I like tea", ref="r-1"), record("I live in Porto", ref="r-2")]
    assert import_interactions(kernel, lines).captured == 2
    kernel.ensure_fresh(10)
    erased = next(c for c in captured(kernel))
    kernel.erase_capture("alice", erased)
    clock.advance(seconds=kernel.settings.idempotency_retention_s + 3600)
    kernel.ensure_fresh(10)
    again = import_interactions(kernel, lines)
    assert again.captured == 0, again
    assert len(captured(kernel)) == 1


def test_an_erased_subject_is_not_brought_back_by_a_reimport(
    kernel: Uprof, clock: FakeClock
) -> None:
    """Held: the whole subject erased, its file imported again (a day later too): every
    record fails naming the subject, nothing is captured, no new subject is created."""
    consent(kernel)
    lines = [record("I like tea", ref="r-1"), record("no ref at all")]
    assert import_interactions(kernel, lines).captured == 2
    kernel.erase_subject("alice")
    clock.advance(seconds=kernel.settings.idempotency_retention_s + 3600)
    again = import_interactions(kernel, lines)
    assert again.captured == 0 and again.subjects == 0, again
    assert [(p.field, p.message) for p in again.failed] == [
        ("subject", "its subject was erased")
    ] * 2
