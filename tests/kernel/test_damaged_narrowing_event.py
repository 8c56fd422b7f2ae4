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
from tests.kernel.conftest import consent, running, say, settings_for
from tests.kernel.test_damaged_event_quarantined import memories, set_aside
from uprof.crypto.mapper import DamagedEventError
from uprof.kernel import Uprof


def damage_first_byte(kernel: Uprof, stream: UUID, topic: str) -> None:
    """Flip a bit of the first byte (the format marker) of ``stream``'s ``topic`` row."""
    alter(kernel, stream, topic, 0, None)


def alter(kernel: Uprof, stream: UUID, topic: str, at: int, new: bytes | None) -> None:
    """Overwrite bytes ``at`` of ``stream``'s first ``topic`` row with ``new`` (None: flip
    the low bit of that byte), in the stored row itself."""
    app = kernel.app
    table = app.recorder.events_table_name  # type: ignore[attr-defined]
    key = app.backend.stream_key(stream)
    with app.events_engine.begin() as conn:
        version, state = next(
            (r[0], r[2])
            for r in conn.execute(
                sa.text(
                    f"SELECT originator_version, topic, state FROM {table} "
                    "WHERE originator_id = :s ORDER BY originator_version"
                ),
                {"s": key},
            )
            if r[1].endswith(topic)
        )
        conn.execute(
            sa.text(
                f"UPDATE {table} SET state = :st WHERE originator_id = :s "
                "AND originator_version = :v"
            ),
            {"st": _altered(bytes(state), at, new), "s": key, "v": version},
        )


def _altered(state: bytes, at: int, new: bytes | None) -> bytes:
    new = bytes([state[at] ^ 0x01]) if new is None else new
    return state[:at] + new + state[at + len(new) :]


ERASED = "I met Qzxerasedcanary at the market"
KEPT = "I met Qzxkeptcanary at the park"


def test_a_damaged_item_erasure_is_not_passed_over(backend: Backend, clock: FakeClock) -> None:
    """On main at 9cb1b23 the rebuild passed over the altered tombstone (it read as
    shredded: no verdict, nothing listed) and alice's profile and export served the
    erased memory again. Now the rebuild stops there and alice's reads fail with
    ``stored_data_damaged``; erasing alice frees the partition."""
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
        with pytest.raises(StoredDataDamagedError):
            k.profile("alice")
        with pytest.raises(StoredDataDamagedError):
            k.export_subject("alice")
        # Erasing the damaged subject (0119) lets the partition go on.
        k.erase_subject("alice")
        k.rebuild()
        assert memories(k, "bob") == live_bob
        assert k.residue_scan([ERASED, "Qzxerasedcanary"]).clean
