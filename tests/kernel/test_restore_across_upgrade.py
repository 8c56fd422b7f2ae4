"""Restore across an upgrade (bug KH, decision 0164-restore-across-upgrade), both backends.

The operator backs up (docs/operations.md tells them to), installs this release and
starts it, which upgrades the stores. Until KH, the backup taken before the upgrade could
not be restored by this release ("restore with the version that made it"), and the
previous release cannot restore into stores it no longer knows: the only way back was an
empty data folder (and, on PostgreSQL, empty key tables). Now ``uprof restore`` takes a
backup of any revision this release upgrades from and brings it to head; killed at any
step (a real process, ``os._exit(9)``), it leaves the restore marker, so every start
refuses, and the restore run again finishes.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from benchmarks.schema_downgrade import PREVIOUS, downgrade_stores
from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, cli_env, running
from tests.kernel.test_keys_apart import (
    ALICE,
    assert_bob_intact,
    assert_erased_everywhere,
    audit_entries,
    filled_deployment,
)
from tests.kernel.test_upgrade_processes import _engines, _revisions, assert_upgraded_and_intact
from uprof.bootstrap import RestoreInterruptedError
from uprof.settings import Settings
from uprof.storage import RESTORE_MARKER, branch_head, layout_for


def _backup_before_the_upgrade(
    backend: Backend, clock: FakeClock, bk: Path, *, erase_after: bool = True
) -> Settings:
    """Alice and bob in stores of the previous schema, backed up; then this release
    starts (the upgrade) and alice is erased: the backup holds her data, sealed."""
    from uprof.services.backup import backup

    settings = filled_deployment(backend, clock, "alice", "bob")
    downgrade_stores(layout_for(settings), PREVIOUS)
    backup(settings, bk)
    assert json.loads((bk / "manifest.json").read_text())["views_revision"] == PREVIOUS["views"]
    with running(settings, clock) as k:  # this release's first start: the upgrade
        if erase_after:
            k.erase_subject("alice")
    return settings


def _assert_restored_at_head(settings: Settings, clock: FakeClock, tmp_path: Path) -> None:
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    assert_upgraded_and_intact(settings, clock)
    with running(settings, clock) as k:
        assert_erased_everywhere(k, "alice", list(ALICE.values()), tmp_path)
        k.audit_log.verify_integrity()
        actions = [e["action"] for e in audit_entries(k, tmp_path / "all.jsonl")]
        assert "backup.restored" in actions


def test_a_backup_of_the_previous_schema_is_restored_and_brought_to_head(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """KH: after the upgrade, the backup taken before it restores; the stores end at
    every branch's head, bob is served, alice (erased after the backup) stays erased,
    the audit log verifies and records the restore."""
    from uprof.services.backup import restore

    settings = _backup_before_the_upgrade(backend, clock, tmp_path / "bk")
    report = restore(settings, tmp_path / "bk")
    assert report.ledger.erased_streams == 1
    _assert_restored_at_head(settings, clock, tmp_path)


def test_a_backup_of_the_previous_schema_restores_into_a_store_not_yet_upgraded(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The release installed but never started (the stores still at the previous
    schema): the restore brings them to head (until KH it was refused, bug JB's check)."""
    from uprof.services.backup import backup, restore

    settings = filled_deployment(backend, clock, "bob")
    downgrade_stores(layout_for(settings), PREVIOUS)
    backup(settings, tmp_path / "bk")
    restore(settings, tmp_path / "bk")
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    assert_upgraded_and_intact(settings, clock)
    assert_bob_intact(settings, clock, audit_verifies=True)


def _resign(settings: Settings, bk: Path, **fields: object) -> None:
    from uprof.services import backup as b

    manifest = json.loads((bk / b.MANIFEST).read_text(encoding="utf-8"))
    manifest.update(fields)
    manifest.pop("signature", None)
    b._sign(settings, manifest)
    (bk / b.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


@pytest.mark.parametrize(
    "revision",
    [
        PREVIOUS["keys"],
        None,
        "0004_views_memory_categories ",
        "0004_VIEWS_MEMORY_CATEGORIES",
        "0003_views",
    ],
)
def test_a_revision_this_release_cannot_upgrade_from_is_refused_naming_file_and_revision(
    backend: Backend, clock: FakeClock, tmp_path: Path, revision: str | None
) -> None:
    """A views revision that is not one of the views branch's (a key-store revision in
    its place) or none at all (a store never migrated): refused, naming the backup's
    views file and the revision, before anything changes. Names are matched exactly: a
    trailing space, another case or a prefix of a real one is refused too (review of
    0170)."""
    from uprof.services.backup import BackupError, backup, restore

    settings = filled_deployment(backend, clock, "bob")
    backup(settings, tmp_path / "bk")
    _resign(settings, tmp_path / "bk", views_revision=revision)
    name = "views.sqlite" if backend.kind == "sqlite" else "database.dump"
    with pytest.raises(BackupError, match=f"{name}.*{revision}.*nothing was changed"):
        restore(settings, tmp_path / "bk")
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    assert_bob_intact(settings, clock, audit_verifies=True)


#: Where ``uprof restore`` of an older backup dies: a statement it runs (the live views
#: taken to the backup's revision, the upgrade after the copy), or a step of its own.
_KILL_POINTS = {
    "taking-live-views-down": "DROP TABLE rate_limit_slots",
    "copy-done-before-upgrade": "step:restore",
    "inside-the-upgrade": "CREATE TABLE rate_limit_slots",
    "before-the-ledger": "step:reapply_ledger",
}

_KILLED_RESTORE = textwrap.dedent(
    """
    import os, sys
    import sqlalchemy as sa

    point = sys.argv.pop(1)
    if point.startswith("step:"):
        step = point[len("step:"):]
        if step == "restore":
            from uprof.backends import backend_for_settings
            from uprof.settings import Settings
            kind = type(backend_for_settings(Settings()))
            real = kind.restore
            def _restore_then_die(self, *args):
                real(self, *args)
                os._exit(9)
            kind.restore = _restore_then_die
        else:
            import uprof.services.recovery as r
            r.reapply_ledger = lambda *a, **k: os._exit(9)
    else:
        @sa.event.listens_for(sa.Engine, "after_cursor_execute")
        def _die(conn, cursor, statement, *rest):
            if point in " ".join(statement.split()):
                os._exit(9)

    from uprof.cli.main import app
    app()
    """
)


@pytest.mark.parametrize("point", list(_KILL_POINTS))
def test_a_restore_across_the_upgrade_killed_at_each_step_is_finished_by_the_next(
    backend: Backend, clock: FakeClock, tmp_path: Path, point: str
) -> None:
    """``uprof restore`` of the pre-upgrade backup, killed in a real process at each step:
    no start serves the half-restored stores (the marker), the restore run again
    finishes, and the result is the same as an uninterrupted one."""
    from uprof.services.backup import restore

    settings = _backup_before_the_upgrade(backend, clock, tmp_path / "bk")
    died = children.run_python(
        _KILLED_RESTORE,
        _KILL_POINTS[point],
        "restore",
        "--from",
        str(tmp_path / "bk"),
        env=cli_env(backend),
        timeout=240,
    )
    assert died.returncode == 9, died.stdout + died.stderr[-3000:]
    assert (settings.data_dir / RESTORE_MARKER).exists()
    with pytest.raises(RestoreInterruptedError):
        build_kernel(settings, clock)
    restore(settings, tmp_path / "bk")
    _assert_restored_at_head(settings, clock, tmp_path)


def test_a_store_downgraded_for_the_restore_keeps_the_live_audit_rows(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The audit entries written after the backup (the upgrade's start, alice's erasure)
    are kept across the schema change: the live log extends the backup's."""
    from uprof.services.backup import restore

    settings = _backup_before_the_upgrade(backend, clock, tmp_path / "bk")
    report = restore(settings, tmp_path / "bk")
    assert report.audit_kept_live
    views, keys = _engines(settings)
    try:
        assert branch_head("views") in _revisions(views)
    finally:
        views.dispose()
        keys.dispose()
    with running(settings, clock) as k:
        actions = [e["action"] for e in audit_entries(k, tmp_path / "all.jsonl")]
        assert "erasure.requested" in actions


def test_a_backup_several_revisions_old_is_restored_and_brought_to_head(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Views five revisions down (``0003``: the batch table rebuilds of 0004 and 0005 on
    the way up, and on the way down for the live views): restored and brought to head."""
    from uprof.services.backup import backup, restore

    settings = filled_deployment(backend, clock, "bob")
    downgrade_stores(layout_for(settings), {**PREVIOUS, "views": "0003_views_idem_sealed"})
    backup(settings, tmp_path / "bk")
    build_kernel(settings, clock).close()  # the upgrade
    restore(settings, tmp_path / "bk")
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    assert_upgraded_and_intact(settings, clock)
    assert_bob_intact(settings, clock, audit_verifies=True)
