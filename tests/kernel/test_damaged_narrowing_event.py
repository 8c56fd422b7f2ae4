"""A damaged event that *narrows* what is served (an item's erasure, a consent's
withdrawal) must not be passed over by the projections (both backends).

Decision 0124 lets the projections set aside an event that fails authentication and go
on (bug DC). For an event that adds (a capture, an item) that withholds data: it fails
closed. For one that takes away, passing over it serves again what it took away: a byte
flipped in the stored ``ItemsErased`` row (damage, or an attacker with write access to
the event store who can read the plaintext topic column) made a rebuild project the
erased memory again, and the subject's profile and export (served from the views while
the stream does not load) listed it (review of 0124, bug EA).
"""

from __future__ import annotations

from uuid import UUID

import pytest
import sqlalchemy as sa

from domain.errors import StoredDataDamagedError
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, consent, running, say, settings_for
from tests.kernel.stored_rows import rewrite_row, stored_rows
from tests.kernel.test_damaged_event_quarantined import memories, set_aside
from uprof.crypto.mapper import DamagedEventError
from uprof.kernel import Uprof


def damage_first_byte(kernel: Uprof, stream: UUID, topic: str) -> None:
    """Flip a bit of the first byte (the format marker) of ``stream``'s ``topic`` row."""
    alter(kernel, stream, topic, 0, None)


def alter(kernel: Uprof, stream: UUID, topic: str, at: int, new: bytes | None) -> None:
    """Overwrite bytes ``at`` of ``stream``'s first ``topic`` row with ``new`` (None: flip
    the low bit of that byte), in the stored row itself."""
    version, found, state = next(r for r in stored_rows(kernel, stream) if r[1].endswith(topic))
    rewrite_row(kernel, stream, version, found, _altered(state, at, new))


def _altered(state: bytes, at: int, new: bytes | None) -> bytes:
    new = bytes([state[at] ^ 0x01]) if new is None else new
    return state[:at] + new + state[at + len(new) :]


ERASED = "I met Qzxerasedcanary at the market"
KEPT = "I met Qzxkeptcanary at the park"


def test_a_damaged_item_erasure_is_not_passed_over(backend: Backend, clock: FakeClock) -> None:
    """On main at 9cb1b23 the rebuild passed over the altered tombstone (it read as
    shredded: no verdict, nothing listed) and alice's profile and export served the
    erased memory again. Now the rebuild refuses before it drops anything (the altered
    tombstone is her anchored head row, decision 0150), so her views stay the live ones,
    without the memory (its capture stays: an item erasure without its evidence); erasing
    alice lets the rebuild run."""
    with running(settings_for(backend), clock) as k:
        consent(k, "alice")
        consent(k, "bob")
        k.capture_many("alice", [say(ERASED, ref="a-1")])
        k.process()
        [item] = [m for m in k.profile("alice").memories if m.text == ERASED]
        k.erase_item("alice", item.item_id)
        assert ERASED not in memories(k, "alice")
        damage_first_byte(k, k.stream_of("alice"), ".ItemsErased")
        k.capture_many("bob", [say(KEPT, ref="b-1")])
        k.process()
        live_bob = memories(k, "bob")
        with pytest.raises(StoredDataDamagedError) as stopped:
            k.rebuild()
        # Fail closed: not the verdict the pipeline sets aside, nothing set aside.
        assert not isinstance(stopped.value, DamagedEventError)
        assert set_aside(k) == []
        assert k.quarantined() == []
        assert ERASED not in memories(k, "alice")
        # Erasing the damaged subject (0119) lets the partition go on.
        k.erase_subject("alice")
        k.rebuild()
        assert memories(k, "bob") == live_bob
        assert k.residue_scan([ERASED, "Qzxerasedcanary"]).clean


def test_a_consent_withdrawal_with_an_altered_marker_does_not_read_as_shredded(
    backend: Backend, clock: FakeClock
) -> None:
    """The marker byte of a subject-sealed row altered to the capture-sealed kind made the
    mapper look up a capture key named by the next 16 bytes, find none, and read the
    event as shredded (applies nothing): on main at 9cb1b23 alice's withdrawal was gone
    from her loaded profile, the consent back in force for the app (``unconsented``
    answered [] in a fresh process). A withdrawal is never sealed under a capture key:
    the row is damaged, and the stream does not load (fail closed)."""
    with running(settings_for(backend), clock) as k:
        consent_id = consent(k, "alice")
        k.withdraw_consent("alice", consent_id)
        assert k.unconsented("alice", APP, ["preferences"], "personalization") == ["preferences"]
        alter(k, k.stream_of("alice"), ".ConsentWithdrawn", 0, b"\x02")
    with running(settings_for(backend), clock) as k:
        with pytest.raises(DamagedEventError):
            k.unconsented("alice", APP, ["preferences"], "personalization")
        with pytest.raises(DamagedEventError):
            k.consents_in_force("alice")


def test_a_consent_withdrawal_naming_an_unknown_key_version_is_damaged(
    backend: Backend, clock: FakeClock
) -> None:
    """The 4-byte key version of a subject-sealed row altered to one its stream never
    had: on main at 9cb1b23 it read as shredded (``key`` answers None for "destroyed or
    unknown"), dropping the withdrawal as above. A stream's keys are destroyed all at
    once, so a stream that still has keys and lacks this one is a damaged row."""
    with running(settings_for(backend), clock) as k:
        consent_id = consent(k, "alice")
        k.withdraw_consent("alice", consent_id)
        alter(k, k.stream_of("alice"), ".ConsentWithdrawn", 1, b"\xff\xff\xff\xff")
    with running(settings_for(backend), clock) as k:
        with pytest.raises(DamagedEventError):
            k.unconsented("alice", APP, ["preferences"], "personalization")


def test_a_withdrawal_swapped_for_another_subjects_does_not_open(
    backend: Backend, clock: FakeClock
) -> None:
    """Held: alice's ``ConsentWithdrawn`` row overwritten with bob's (same topic, same
    format, bob's DEK version) fails authentication under alice's key (the associated
    data names the stream and version): damaged, and alice's consent checks fail closed
    in a fresh process."""
    with running(settings_for(backend), clock) as k:
        for subject in ("alice", "bob"):
            k.withdraw_consent(subject, consent(k, subject))
        bob_row = _row(k, k.stream_of("bob"), ".ConsentWithdrawn")
        assert len(bob_row) == len(_row(k, k.stream_of("alice"), ".ConsentWithdrawn"))
        alter(k, k.stream_of("alice"), ".ConsentWithdrawn", 0, bob_row)
    with running(settings_for(backend), clock) as k:
        with pytest.raises(DamagedEventError):
            k.unconsented("alice", APP, ["preferences"], "personalization")
        assert k.unconsented("bob", APP, ["preferences"], "personalization") == ["preferences"]


def _row(kernel: Uprof, stream: UUID, topic: str) -> bytes:
    app = kernel.app
    table = app.recorder.events_table_name  # type: ignore[attr-defined]
    with app.events_engine.connect() as conn:
        rows = conn.execute(
            sa.text(f"SELECT topic, state FROM {table} WHERE originator_id = :s"),
            {"s": app.backend.stream_key(stream)},
        ).all()
    return next(bytes(r[1]) for r in rows if r[0].endswith(topic))
