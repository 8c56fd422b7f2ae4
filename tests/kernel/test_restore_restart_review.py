"""Review of 0178 and 0183: ``uprof restore --restart-audit-log`` killed twice in a row,
receipts across a restart, and another deployment's backup. Both backends; restores
killed in real processes (``os._exit``, no cleanup, as kill -9) at 0178's three points.

- Bug OC: a restart recorded by a killed run (its key history record written), run
  again *without* the flag, was taken for a restore that restarts nothing: its marker
  then said ``restarts_audit_log: false``, its ``backup.restored`` entry did not name
  ``audit-log-restarted``, it reported no restart; killed again and run with the flag,
  it was refused "nothing to restart": the trail never said the operator restarted
  the log, while the key history did.
- Bug OD: another deployment's backup (its manifest's signature and deployment id
  removed, restored with ``--allow-unsigned``, as an operator who believes it is this
  deployment's may) restored with ``--restart-audit-log``: the current key signed, in
  the key history, a restart of the log at the other deployment's root, before the
  restore found the log's checkpoints signed by keys this deployment never had. The
  history keeps that record for good, and the restore failed after it.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from audit.errors import VerificationError
from audit.receipts import verify_receipt
from domain.errors import SubjectErasedError
from domain.principal import Principal
from tests.children import run_python
from tests.conftest import Backend, _create_pg_database, _drop_pg_database, _pg_url
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, cli_env, running, settings_for
from tests.kernel.test_admin_audit import cli_for
from tests.kernel.test_keys_apart import ALICE, BOB, canaries, fill
from tests.kernel.test_restore_bad_input import _empty_data_stores
from tests.kernel.test_restore_fork import (
    _history,
    _pre_rotation_backup,
    _whole_trail,
    load_pem_current,
)
from tests.kernel.test_restore_fork_killed import POINTS
from uprof.bootstrap import RestoreInterruptedError
from uprof.facade import Facade
from uprof.services.backup import BackupError, backup, restore
from uprof.settings import Settings
from uprof.storage import RESTORE_MARKER

RESTART = "--restart-audit-log"


def _killed(backend: Backend, backup_dir: Path, point: str, *flags: str) -> None:
    """``uprof restore --from BACKUP --allow-unsigned FLAGS`` killed at ``point``."""
    script = "import os\n" + textwrap.dedent(POINTS[point])
    script += "from uprof.cli.main import app\napp()\n"
    args = ("restore", "--from", str(backup_dir), "--allow-unsigned", *flags)
    died = run_python(script, *args, env=cli_env(backend), timeout=180)
    assert died.returncode == 9, died.stdout + died.stderr[-3000:]


def _marker(settings: Settings) -> dict[str, Any]:
    marked: dict[str, Any] = json.loads((settings.data_dir / RESTORE_MARKER).read_text())
    return marked


#: (first kill, flag of the first run again, its kill, flag of the run that finishes).
#: A run again after its restart was recorded passes no later kill point of a restart
#: (it records none): it is killed after its copy or after its audit entry.
TWICE = {
    "copy+restart-record": ("after-copy", True, "after-restart-record", False),
    "restart-record+copy": ("after-restart-record", False, "after-copy", True),
    "restart-record+entry": ("after-restart-record", True, "after-audit-entry", False),
    "entry+copy": ("after-audit-entry", False, "after-copy", False),
    "copy+copy": ("after-copy", True, "after-copy", True),
}


@pytest.mark.parametrize("case", list(TWICE))
def test_oc_a_restart_killed_twice_in_a_row_is_finished_and_recorded_once(
    backend: Backend, clock: FakeClock, tmp_path: Path, case: str
) -> None:
    settings, before = _pre_rotation_backup(backend, clock, tmp_path)
    first, again_flag, again_point, finish_flag = TWICE[case]
    _killed(backend, tmp_path / "bk", first, RESTART)
    _killed(backend, tmp_path / "bk", again_point, *([RESTART] if again_flag else []))
    # Every start refuses while the marker stays, and it still says the restore
    # restarts the log (main at 5e738d2: false after a run again without the flag).
    with pytest.raises(RestoreInterruptedError):
        build_kernel(settings, clock)
    assert _marker(settings)["restarts_audit_log"] is True

    report = restore(settings, tmp_path / "bk", allow_unsigned=True, restart_audit_log=finish_flag)
    assert report.audit_restarted_at == before.backup_size
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    with running(settings, clock) as k:
        fill(k, "dave", canaries("dave"))
        assert k.audit_log.size() > before.point
        k.audit_log.verify_integrity()
        history = _history(k)
        restored = [e.entry for e in k.audit_log.entries(action="backup.restored")]
        rotated = [e.entry for e in k.audit_log.entries(action="audit.key_rotated")]
    restarts = [r["log_restart"] for r in history["keys"] if "log_restart" in r]
    assert [r["abandoned"]["tree_size"] for r in restarts] == [before.point]
    assert history["keys"][-1]["previous_key_retired_at"]["tree_size"] == before.backup_size
    # The restore that finished says the operator restarted the log.
    assert "audit-log-restarted" in restored[-1]["rule"], restored[-1]
    # Each rotation of the history is on the log once (the restart's, or recorded late).
    assert sorted(e["audit_key_seq"] for e in rotated) == list(range(1, len(history["keys"])))
    assert _whole_trail(settings, clock).rotation_points_checked >= 1
    # And offline, with the command an auditor runs.
    run = cli_for(backend)
    trail, pem, keys = tmp_path / "trail.jsonl", tmp_path / "audit.pem", tmp_path / "keys.json"
    run("audit", "export", "--out", str(trail))
    run("audit", "public-key", "--out", str(pem))
    run("audit", "keys", "--out", str(keys))
    said = " ".join(
        run(
            "audit", "verify", str(trail), "--public-key", str(pem), "--key-history", str(keys)
        ).split()
    )
    assert said.startswith("verified:") and "rotation point" in said, said


# ------------------------------------------------------------ receipts and a restart


@dataclass(frozen=True)
class Receipts:
    """Erasure receipts of the old timeline: inside the backup's log (first key), in the
    range the restart abandons (first key), and past the rotation point (second key)."""

    in_backup: dict[str, Any]
    abandoned: dict[str, Any]
    beyond: dict[str, Any]
    backup_size: int
    point: int


def _receipts_then_lost(backend: Backend, clock: FakeClock, tmp_path: Path) -> Receipts:
    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        fill(k, "erin", canaries("erin"))
        in_backup = k.erase_subject("erin").receipt
        fill(k, "frank", canaries("frank"))
        backup_size = k.audit_log.size()
    backup(settings, tmp_path / "bk")
    with running(settings, clock) as k:
        fill(k, "carol", canaries("carol"))
        abandoned = k.erase_subject("carol").receipt
        Facade(k, Principal.local_operator(k.subjects.tenant)).rotate_audit_key()
        point = _history(k)["keys"][-1]["previous_key_retired_at"]["tree_size"]
        fill(k, "gus", canaries("gus"))
        beyond = k.erase_subject("gus").receipt
    assert in_backup["inclusion"]["tree_size"] <= backup_size
    assert backup_size < abandoned["inclusion"]["tree_size"] <= point
    assert beyond["inclusion"]["tree_size"] > point
    _empty_data_stores(backend, settings)
    return Receipts(in_backup, abandoned, beyond, backup_size, point)


def test_receipts_before_and_after_a_restart_verify_offline_as_the_restart_says(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Held: after a restart at m, with the key history as it is now, offline (the
    library and ``uprof audit verify-receipt``): a receipt issued after the restart
    verifies; one inside the backup's log verifies with its rotation proof, which the
    restarted deployment hands out (``uprof audit rotation-proof``); the abandoned
    range's, by the first key or the second, is refused naming the restart, and the
    deployment hands out no proof for it. The erasures stay made (the ledger)."""
    receipts = _receipts_then_lost(backend, clock, tmp_path)
    settings = settings_for(backend)
    restore(settings, tmp_path / "bk", allow_unsigned=True, restart_audit_log=True)
    with running(settings, clock) as k:
        fill(k, "bob", BOB)
        after = k.erase_subject("bob").receipt
        history = _history(k)
        for gone in ("carol", "gus", "erin"):
            with pytest.raises(SubjectErasedError):
                k.profile(gone)
    current = load_pem_current(settings)
    origin = settings.audit_origin
    verify_receipt(after, current, origin=origin, key_history=history)
    with pytest.raises(VerificationError, match="rotation_proof"):
        verify_receipt(receipts.in_backup, current, origin=origin, key_history=history)
    for refused in (receipts.abandoned, receipts.beyond):
        with pytest.raises(VerificationError, match="restarted"):
            verify_receipt(refused, current, origin=origin, key_history=history)

    run = cli_for(backend)
    pem, keys = tmp_path / "audit.pem", tmp_path / "keys.json"
    run("audit", "public-key", "--out", str(pem))
    run("audit", "keys", "--out", str(keys))
    files = {}
    for name, receipt in (
        ("after", after),
        ("in_backup", receipts.in_backup),
        ("abandoned", receipts.abandoned),
        ("beyond", receipts.beyond),
    ):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(receipt))
    verify = ("audit", "verify-receipt", "--public-key", str(pem), "--key-history", str(keys))
    assert "receipt verified" in run(*verify[:2], str(files["after"]), *verify[2:])
    proof = tmp_path / "proof.json"
    said = " ".join(
        run("audit", "rotation-proof", str(files["in_backup"]), "--out", str(proof)).split()
    )
    assert f"to the rotation point {receipts.backup_size} " in said, said
    checked = run(*verify[:2], str(files["in_backup"]), *verify[2:], "--rotation-proof", str(proof))
    assert "receipt verified" in checked
    for name in ("abandoned", "beyond"):
        said = " ".join(run(*verify[:2], str(files[name]), *verify[2:], code=1).split())
        assert "receipt does not verify" in said and "restarted" in said, said
        said = " ".join(
            run("audit", "rotation-proof", str(files[name]), "--out", str(proof), code=2).split()
        )
        assert "restarted" in said, said


# ------------------------------------------------------ another deployment's backup


def test_od_another_deployments_backup_is_refused_before_the_restart_is_recorded(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings, before = _pre_rotation_backup(backend, clock, tmp_path)
    history_before = (settings.key_path / "audit-keys.json").read_bytes()
    other_db = _create_pg_database(prefix="uprof_other") if backend.kind == "postgres" else None
    try:
        other = Backend(backend.kind, other_db and _pg_url(other_db), tmp_path / "other")
        with running(settings_for(other), clock) as k:
            fill(k, "yves", canaries("yves"))
            k.erase_subject("yves")  # its log holds checkpoints signed by its own key
            assert k.audit_log.size() < before.point
        backup(settings_for(other), tmp_path / "foreign")
    finally:
        if other_db:
            _drop_pg_database(other_db)
    manifest_path = tmp_path / "foreign" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["signature"]
    manifest["deployment"] = None  # as a manifest of before 2026-12-04 (unsigned, no id)
    manifest_path.write_text(json.dumps(manifest))

    with pytest.raises(BackupError, match="another deployment"):
        restore(settings, tmp_path / "foreign", allow_unsigned=True, restart_audit_log=True)
    # main at 5e738d2: a restart of the other deployment's log, signed into the history.
    assert (settings.key_path / "audit-keys.json").read_bytes() == history_before
    # The deployment's own backup, restarted, then restores (the data stores emptied
    # of the other deployment's copy, as the refusal says).
    _empty_data_stores(backend, settings)
    report = restore(settings, tmp_path / "bk", allow_unsigned=True, restart_audit_log=True)
    assert report.audit_restarted_at == before.backup_size
    assert _whole_trail(settings, clock).rotation_points_checked >= 1
