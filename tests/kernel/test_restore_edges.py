"""Restore edges left by the reviews of decision 0164 (bug LE), both backends.

LE: a backup naming a views revision below the one-way migration 0003 (``0001_views``,
``0002_audit``) was accepted: the live views' downgrade then failed on 0003 AFTER the
restore marker was written, so every start refused until another backup was restored.
It is refused now before anything changes, naming the file and the revision.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.schema_downgrade import PREVIOUS, downgrade_stores
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running
from tests.kernel.test_keys_apart import assert_bob_intact, filled_deployment
from tests.kernel.test_restore_across_upgrade import _resign
from uprof.services.backup import _restorable_revisions
from uprof.storage import RESTORE_MARKER, layout_for


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


def test_every_migration_whose_downgrade_is_refused_says_so() -> None:
    """Held (review of 0170): the restore learns where it cannot go down from the
    ``one_way`` marker alone, so a later migration whose downgrade raises and that lacks
    the marker would bring LE back (the downgrade failing after the marker). Every
    migration whose ``downgrade`` raises is marked ``one_way = True`` (the literal, not a
    truthy string), and the restore's lowest revision is the newest such of the views
    branch; the other branches are never taken down by a restore."""
    import ast

    from uprof.storage import MIGRATIONS_DIR

    refusing, marked = set(), set()
    for path in sorted((MIGRATIONS_DIR / "versions").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {
            t.id: n.value.value
            for n in tree.body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "downgrade":
                if any(isinstance(n, ast.Raise) for n in ast.walk(node)):
                    refusing.add(names["revision"])
        if names.get("one_way") is True:
            marked.add(names["revision"])
    assert refusing == marked, (refusing, marked)
    assert "0003_views_idem_sealed" in marked
    assert _restorable_revisions()[-1] in marked


@pytest.mark.parametrize("revision", _restorable_revisions()[1:])
def test_every_revision_the_restore_accepts_is_restored(
    backend: Backend, clock: FakeClock, tmp_path: Path, revision: str
) -> None:
    """Held (review of 0170): LE's promise the other way round. Every views revision the
    restore accepts below head (down to the one-way migration) is one the live views can
    be taken down to after the marker: a real backup of stores at that revision, the
    release started since (the upgrade), restores to the end, no marker left, bob served
    and the audit log whole. A later migration whose downgrade fails on live data would
    fail here, not in an operator's restore."""
    from uprof.services.backup import backup, restore

    settings = filled_deployment(backend, clock, "bob")
    downgrade_stores(layout_for(settings), {"views": revision, "keys": PREVIOUS["keys"]})
    backup(settings, tmp_path / "bk")
    with running(settings, clock):
        pass  # this release's start: the upgrade, and the live views at head
    restore(settings, tmp_path / "bk")
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    assert_bob_intact(settings, clock, audit_verifies=True)
