"""Restore edges left by the reviews of decision 0164 (bug LE), both backends.

LE: a backup naming a views revision below the one-way migration 0003 (``0001_views``,
``0002_audit``) was accepted: the live views' downgrade then failed on 0003 AFTER the
restore marker was written, so every start refused until another backup was restored.
It is refused now before anything changes, naming the file and the revision.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.test_keys_apart import assert_bob_intact, filled_deployment
from tests.kernel.test_restore_across_upgrade import _resign
from uprof.storage import RESTORE_MARKER


@pytest.mark.parametrize("revision", ["0001_views", "0002_audit"])
def test_a_revision_below_a_one_way_migration_is_refused_before_anything_changes(
    backend: Backend, clock: FakeClock, tmp_path: Path, revision: str
) -> None:
    """LE: a views revision of the branch, but below 0003 (whose downgrade is refused):
    no marker, the live stores untouched and still starting, the error naming the file,
    the revision and why."""
    from uprof.services.backup import BackupError, backup, restore

    settings = filled_deployment(backend, clock, "bob")
    backup(settings, tmp_path / "bk")
    _resign(settings, tmp_path / "bk", views_revision=revision)
    name = "views.sqlite" if backend.kind == "sqlite" else "database.dump"
    with pytest.raises(
        BackupError,
        match=f"{name}.*{revision}.*older than the oldest revision.*nothing was changed",
    ):
        restore(settings, tmp_path / "bk")
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    assert_bob_intact(settings, clock, audit_verifies=True)
