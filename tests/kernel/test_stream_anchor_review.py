"""Attacks on the stream-head anchor (review of decision 0132), both backends.

GM: a writer of the event store cuts a consent's withdrawal off the end of a stream;
a copy of the subject loaded before the withdrawal (the read recorder's and the capture
writer's cached copies, a verdict appended at ``head + 1``: every save that does not go
through ``load``) then appends into the cut slot and past it. The raise after that save
must not move the anchor over the cut: the stream stays damage, the consent withdrawn
never comes back into force.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import UUID

import pytest
import sqlalchemy as sa

from domain.errors import StoredDataDamagedError
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, consent, running, say, settings_for
from tests.kernel.test_group_commit import _pending
from uprof.kernel import Uprof
from uprof.services.backup import backup, restore
from uprof.settings import Settings

CATS, PURPOSE = ["preferences"], "personalization"


@contextmanager
def stream_rows(k: Uprof, stream: UUID) -> Iterator[tuple[sa.Connection, str, str, int]]:
    """An attacker's hold on a stream's stored rows (a writer of the event store only): a
    transaction on the event store, the events table's name, the stream's stored key and
    its head version."""
    app = k.app
    table = app.recorder.events_table_name  # type: ignore[attr-defined]
    key = app.backend.stream_key(stream)
    with app.events_engine.begin() as conn:
        head = conn.execute(
            sa.text(f"SELECT MAX(originator_version) FROM {table} WHERE originator_id = :s"),
            {"s": key},
        ).scalar_one()
        yield conn, table, key, head


def _cut_head(k: Uprof, stream: UUID) -> int:
    """The attacker: delete the stream's newest row (a writer of the event store only)."""
    with stream_rows(k, stream) as (conn, table, key, head):
        conn.execute(
            sa.text(f"DELETE FROM {table} WHERE originator_id = :s AND originator_version = :v"),
            {"s": key, "v": head},
        )
    return int(head)


def _record_reads(profile: object, n: int) -> None:
    for _ in range(n):
        profile.record_slice_served(  # type: ignore[attr-defined]
            app_id=APP,
            agent_id="coach",
            purpose=PURPOSE,
            item_ids=[],
            served_at=datetime(2026, 1, 1, tzinfo=UTC),
            budget_tokens=200,
            n_tokens=0,
        )


@pytest.mark.parametrize("saves", [1, 2, 3], ids=["one-save-of-two", "two-saves", "three-saves"])
def test_a_stale_copy_appending_over_a_cut_withdrawal_does_not_launder_it(
    backend: Backend, clock: FakeClock, saves: int
) -> None:
    """alice consents; a cached copy of her is taken; she withdraws (anchored); the
    withdrawal row is deleted; the stale copy records reads (two in one save, or one
    in each of two or three saves from a copy that stays cached), the first into the cut
    slot. A fresh process
    must refuse alice as damage, never serve her consent as in force again."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        granted = consent(k, "alice")
        stream = k.stream_of("alice")
        stale = k.app.load(stream)  # a cached copy, as the read recorder keeps one
        k.withdraw_consent("alice", granted)
        assert k.unconsented("alice", APP, CATS, PURPOSE) == CATS
        withdrawn_at = _cut_head(k, stream)
        assert stale.version == withdrawn_at - 1
        if saves == 1:
            _record_reads(stale, 2)
            k.app.save(stale)
        else:
            for _ in range(saves):
                _record_reads(stale, 1)
                k.app.save(stale)
        assert stale.version == withdrawn_at + max(saves, 2) - 1
    with running(settings, clock) as k:
        with pytest.raises(StoredDataDamagedError):
            k.unconsented("alice", APP, CATS, PURPOSE)
        with pytest.raises(StoredDataDamagedError):
            consent(k, "alice")


def test_a_backup_restored_in_another_folder_then_moved_into_place_is_not_damage(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """GN. The operator restores a backup into a fresh folder beside the live key folder
    (``uprof restore`` with ``--key-dir``), stops the server and swaps the folders. The
    restored log now lives at the live path, whose anchors name the heads written after
    the backup: every subject written since must load as restored, not as damage."""
    if backend.kind != "sqlite":
        pytest.skip("a PostgreSQL log's identity does not depend on a folder")
    live = settings_for(backend)
    with running(live, clock) as k:
        granted = consent(k, "alice")
    backup(live, tmp_path / "bk")
    with running(live, clock) as k:
        k.withdraw_consent("alice", granted)
        assert k.unconsented("alice", APP, CATS, PURPOSE) == CATS
    staging = Settings(
        data_dir=backend.data_dir / "staging",
        key_dir=live.key_path,
        embedder=live.embedder,
    )
    restore(staging, tmp_path / "bk")
    live.data_dir.rename(backend.data_dir / "data-before-restore")
    staging.data_dir.rename(live.data_dir)
    with running(live, clock) as k:
        assert k.unconsented("alice", APP, CATS, PURPOSE) == []  # as restored


def test_the_capture_writers_cached_copy_refuses_a_stream_cut_below_its_anchor(
    backend: Backend, clock: FakeClock
) -> None:
    """GO. The capture writer keeps a copy of alice after a capture and only catches it
    up later (it never loads her again). She withdraws in another writer, and the
    withdrawal row is deleted: the copy is as far as the stream, so on main the next
    capture was accepted under the withdrawn consent (and written into the emptied
    slot). The catch-up must see the stream below its anchor and refuse it as damage."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        granted = consent(k, "alice")
        writer = k.capture_service.writer
        first = _pending(k, "alice", say("I like green tea"))
        writer.commit([first])
        assert first.error is None
        k.withdraw_consent("alice", granted)
        _cut_head(k, first.stream_id)
        before = k.app.stream_versions([first.stream_id])[first.stream_id]
        second = _pending(k, "alice", say("I like mint"))
        writer.commit([second])
        assert isinstance(second.error, StoredDataDamagedError)
        assert k.app.stream_versions([first.stream_id])[first.stream_id] == before


def test_a_profile_as_of_a_time_refuses_a_stream_cut_below_its_anchor(
    backend: Backend, clock: FakeClock
) -> None:
    """GP. ``profile --as-of`` replays the stream's events without loading it
    (``stream_events``, which reads no anchor). With alice's withdrawal cut off the end,
    it served her history as if the withdrawal had never happened. It must refuse the
    stream as damage, as every other read of the subject does."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        granted = consent(k, "alice")
        k.withdraw_consent("alice", granted)
        _cut_head(k, k.stream_of("alice"))
        later = datetime.now(UTC) + timedelta(days=1)
        with pytest.raises(StoredDataDamagedError):
            k.profile("alice", as_of=later)


def test_the_capture_writers_catch_up_refuses_a_cut_slot_filled_again(
    backend: Backend, clock: FakeClock
) -> None:
    """GQ. As GO, but another stale copy (the read recorder's) has already written into
    the emptied slot, so the stream is back at its anchor's version: the capture writer's
    catch-up read that row as new and applied it, and accepted the capture under the
    withdrawn consent. The row at the anchor's version is not the one anchored: damage."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        granted = consent(k, "alice")
        writer = k.capture_service.writer
        first = _pending(k, "alice", say("I like green tea"))
        writer.commit([first])
        stale = k.app.load(first.stream_id)  # the read recorder's copy
        k.withdraw_consent("alice", granted)
        _cut_head(k, first.stream_id)
        _record_reads(stale, 1)
        k.app.save(stale)  # into the emptied slot
        before = k.app.stream_versions([first.stream_id])[first.stream_id]
        second = _pending(k, "alice", say("I like mint"))
        writer.commit([second])
        assert isinstance(second.error, StoredDataDamagedError)
        assert k.app.stream_versions([first.stream_id])[first.stream_id] == before
