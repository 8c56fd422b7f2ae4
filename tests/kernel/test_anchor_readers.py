"""Readers of the event log that do not go through ``load`` (attack round on the
stream-head anchors, decision 0150-anchor-readers), both backends.

A writer of the event store (not of the key store) cuts a subject stream's newest row:
the item erasure. A load refuses the stream (0132). A rebuild of the views replays the
log through the notification reader, which reads no anchor: it projected the stream as
it now ends, and the erased memory was served again by the profile and the export
(bug IS). A rebuild now checks every anchor of the log before it drops anything, and
refuses (``StoredDataDamagedError``) while a stream is below its anchor or its anchored
row was replaced; the views stay as they were.
"""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

import pytest
import sqlalchemy as sa

from domain.errors import StoredDataDamagedError
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, consent, running, say, settings_for
from tests.kernel.test_damaged_event_quarantined import memories
from tests.kernel.test_stream_anchor_review import _cut_head, stream_rows
from uprof.kernel import Uprof
from uprof.services.backup import backup, restore

ERASED = "I met Qzxerasedcanary at the market"
KEPT = "I met Qzxkeptcanary at the park"
LATER = "I met Qzxlatercanary at the pool"
CATS, PURPOSE = ["preferences"], "personalization"


def _replace_head(k: Uprof, stream: UUID) -> None:
    """The attacker: put the row below the head in the head's place (same version, a
    genuine row of the stream: versions stay contiguous)."""
    with stream_rows(k, stream) as (conn, table, key, head):
        below = conn.execute(
            sa.text(
                f"SELECT topic, state FROM {table} "
                "WHERE originator_id = :s AND originator_version = :v"
            ),
            {"s": key, "v": head - 1},
        ).one()
        conn.execute(
            sa.text(
                f"UPDATE {table} SET topic = :t, state = :st "
                "WHERE originator_id = :s AND originator_version = :v"
            ),
            {"s": key, "v": head, "t": below[0], "st": below[1]},
        )


def _alice_with_an_erased_memory(k: Uprof) -> UUID:
    consent(k, "alice")
    consent(k, "bob")
    k.capture_many("alice", [say(ERASED, ref="a-1")])
    k.capture_many("bob", [say(KEPT, ref="b-1")])
    k.process()
    [item] = [m for m in k.profile("alice").memories if m.text == ERASED]
    k.erase_item("alice", item.item_id)
    k.process()
    assert ERASED not in memories(k, "alice")
    return k.stream_of("alice")


@pytest.mark.parametrize("attack", ["cut", "replaced"])
def test_a_rebuild_refuses_a_stream_below_its_anchor(
    backend: Backend, clock: FakeClock, attack: str
) -> None:
    """IS. On main the rebuild replayed alice's stream without its erasure and her
    profile and export listed the erased memory again."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        stream = _alice_with_an_erased_memory(k)
        (_cut_head if attack == "cut" else _replace_head)(k, stream)
        with pytest.raises(StoredDataDamagedError):
            k.app.load(stream)  # the load already refuses it
        # The log goes on (another subject): the views are not ahead of it at the next
        # start, which would rebuild them itself (``rebuild_views_ahead_of_log``).
        k.capture_many("bob", [say(LATER, ref="b-2")])
        k.process()
    with running(settings, clock) as k:
        with pytest.raises(StoredDataDamagedError):
            k.rebuild()
        # Nothing was dropped and nothing erased comes back: alice's own reads ask her
        # log which of the ledger's items it erased (0240-readers-beside-a-rebuild, WY),
        # and a log cut below its anchor is told as the damage it is, as a stream deleted
        # whole is (0227, UT); the other subjects' reads are served.
        with pytest.raises(StoredDataDamagedError):
            memories(k, "alice")
        with pytest.raises(StoredDataDamagedError):
            k.export_subject("alice")
        assert KEPT in memories(k, "bob")


def test_a_rebuild_of_a_whole_log_is_not_refused(backend: Backend, clock: FakeClock) -> None:
    """The check refuses nothing honest: anchors lagging (a head above its anchor) or
    missing (a stream written before anchors) are adopted, as a load adopts them."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        stream = _alice_with_an_erased_memory(k)
        with k.keystore._engine.begin() as conn:  # type: ignore[attr-defined]
            conn.execute(
                sa.text("DELETE FROM stream_heads WHERE stream_id = :s"), {"s": str(stream)}
            )
        k.rebuild()
        assert ERASED not in memories(k, "alice")
        assert KEPT in memories(k, "bob")


def test_a_backup_of_a_stream_cut_below_its_anchor_is_refused(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """IT. alice withdraws her consent; the withdrawal is cut from her stream; the
    operator's routine backup copies the log and signs it. On main the backup was
    written, and restoring it re-anchored the cut log (``reanchor``): the withdrawal was
    gone for good and her consent in force again. The backup now refuses to vouch for
    a log that a load refuses, and writes nothing."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        granted = consent(k, "alice")
        k.withdraw_consent("alice", granted)
        assert k.unconsented("alice", APP, CATS, PURPOSE) == CATS
        _cut_head(k, k.stream_of("alice"))
    with pytest.raises(StoredDataDamagedError):
        backup(settings, tmp_path / "bk")
    assert not (tmp_path / "bk").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bk.partial")]
    with running(settings, clock) as k:  # nothing changed: still refused, never in force
        with pytest.raises(StoredDataDamagedError):
            k.unconsented("alice", APP, CATS, PURPOSE)


def test_a_backup_of_a_whole_log_restores(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The backup's check refuses nothing honest (a stream without an anchor included)."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        granted = consent(k, "alice")
        k.withdraw_consent("alice", granted)
        consent(k, "bob")
        with k.keystore._engine.begin() as conn:  # type: ignore[attr-defined]
            conn.execute(
                sa.text("DELETE FROM stream_heads WHERE stream_id = :s"),
                {"s": str(k.stream_of("bob"))},
            )
    backup(settings, tmp_path / "bk")
    restore(settings, tmp_path / "bk")
    with running(settings, clock) as k:
        assert k.unconsented("alice", APP, CATS, PURPOSE) == CATS
        assert k.unconsented("bob", APP, CATS, PURPOSE) == []
