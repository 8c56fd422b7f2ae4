"""Attack review of decision 0164-restore-across-upgrade (bugs LB, LC, LD), both backends.

What was attacked and held stays here as a test too (an item erasure made after the
backup stays erased across a restore of the previous schema's backup).

LB: a consent withdrawn after the backup was in force again after ``uprof restore``: the
restore re-applied the erasure ledger but not the withdrawals, which only the kept live
audit log records. The app was served the subject's data again (I2).

LC: a symlink named like a partial backup folder in the parent folder (``.<name>.partial-
<8 hex>`` pointing elsewhere) made every ``uprof backup`` into that folder fail with a raw
``OSError: Cannot call rmtree on a symbolic link``; the residue audit reported it as a
left-over copy of the stores.

LD: ``uprof audit residue --backups <folder>`` with a folder that does not exist (a typo,
an unmounted volume) reported ``residue: 0`` and exit 0: a security check that passed on
nothing looked at.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.schema_downgrade import PREVIOUS, downgrade_stores
from tests.children import CLI_SCRIPT, run_python
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, build_kernel, cli_env, running
from tests.kernel.test_keys_apart import BOB, assert_bob_intact, filled_deployment
from uprof.services.backup import backup, partials, remove_stale_partials, restore
from uprof.settings import Settings
from uprof.storage import layout_for


def _previous_schema_backup(backend: Backend, clock: FakeClock, bk: Path) -> Settings:
    """Bob in stores of the previous schema, backed up (the backup an operator takes
    before upgrading); the stores are then upgraded by this release's first start."""
    settings = filled_deployment(backend, clock, "bob")
    downgrade_stores(layout_for(settings), PREVIOUS)
    backup(settings, bk)
    build_kernel(settings, clock).close()  # the upgrade
    return settings


def test_a_consent_withdrawn_after_the_backup_stays_withdrawn_after_the_restore(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """LB: bob withdraws the app's consent after the backup; the restore of that
    backup (the previous schema's, taken down and up again) must not put it back."""
    settings = _previous_schema_backup(backend, clock, tmp_path / "bk")
    with running(settings, clock) as k:
        grants = k.consents_in_force("bob", app_id=APP)
        assert grants
        for grant in grants:
            k.withdraw_consent("bob", grant.consent_id)
        assert k.unconsented("bob", APP, ["*"], "personalization") == ["*"]
    restore(settings, tmp_path / "bk")
    with running(settings, clock) as k:
        assert k.consents_in_force("bob", app_id=APP) == []
        assert k.unconsented("bob", APP, ["*"], "personalization") == ["*"]
        k.audit_log.verify_integrity()
    # A second restore of the same backup writes the withdrawal once more, not twice:
    # the stream's own withdrawal is in the backup's log only once it was written again.
    restore(settings, tmp_path / "bk")
    with running(settings, clock) as k:
        assert k.consents_in_force("bob", app_id=APP) == []


def test_an_item_erased_after_the_backup_stays_erased_after_the_restore(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Attacked, held: an item erased (with its evidence) after the previous schema's
    backup stays erased once that backup is restored and brought to head."""
    settings = _previous_schema_backup(backend, clock, tmp_path / "bk")
    with running(settings, clock) as k:
        item = next(a for a in k.profile("bob").attributes if BOB["attribute"] in a.value)
        k.erase_item("bob", item.item_id, with_evidence=True)
    restore(settings, tmp_path / "bk")
    with running(settings, clock) as k:
        assert BOB["attribute"] not in [a.value for a in k.profile("bob").attributes]
        assert BOB["attribute"] not in json.dumps(k.export_subject("bob"))
        k.audit_log.verify_integrity()


def test_a_symlink_named_like_a_partial_neither_blocks_a_backup_nor_is_followed(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """LC: a symlink ``.<name>.partial-<hex>`` in the backups folder, to a folder
    elsewhere: the backup into that folder completes, what the link points to is left
    whole, the link is not reported as a killed backup's copy of the stores."""
    settings = filled_deployment(backend, clock, "bob")
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("keep", encoding="utf-8")
    link = out / ".bk0.partial-deadbeef"
    link.symlink_to(elsewhere, target_is_directory=True)
    assert partials(out) == []
    assert remove_stale_partials(out) == []
    made = run_python(
        CLI_SCRIPT, "backup", "--to", str(out / "bk1"), env=cli_env(backend), timeout=180
    )
    assert made.returncode == 0, made.stdout + made.stderr[-3000:]
    assert (elsewhere / "precious").read_text(encoding="utf-8") == "keep"
    assert link.is_symlink()
    assert sorted(p.name for p in out.iterdir()) == [link.name, "bk1"]  # no lock file left
    restore(settings, out / "bk1")
    assert_bob_intact(settings, clock, audit_verifies=True)


def test_a_lock_file_symlink_creates_nothing_where_it_points(tmp_path: Path) -> None:
    """LC: a dangling symlink named like a partial's lock file: the cleaner must not
    create the file it points to (an empty file anywhere the process may write)."""
    target = tmp_path / "elsewhere" / "created-by-the-cleaner"
    target.parent.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / ".bk0.partial-deadbeef.lock").symlink_to(target)
    remove_stale_partials(out)
    assert not target.exists()


def test_the_residue_audit_refuses_a_backups_folder_that_does_not_exist(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """LD: ``--backups`` naming no folder is an error naming the option (exit 2), never
    "residue: 0" about a folder nothing looked at."""
    filled_deployment(backend, clock, "bob")
    done = run_python(
        CLI_SCRIPT, "audit", "residue", "--term", "Qzxnothere", "--backups", str(tmp_path / "typo"),
        env=cli_env(backend), timeout=180,
    )  # fmt: skip
    text = done.stdout + done.stderr[-2000:]
    assert done.returncode == 2, text
    assert "--backups" in text and "residue: 0" not in text, text
