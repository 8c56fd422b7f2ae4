"""Review of 0190: ``uprof restore --restart-audit-log`` killed (``os._exit``, no cleanup,
as kill -9) at each step of OD's check of the backup's log and of the restart's signing,
in real processes; and two restores of one data folder at once. Both backends.

- Killed at each step, the deployment's key history is never half-written (it parses and
  verifies with the current key, with at most the one restart) and its erasure ledger
  reads; every start refuses while the marker stays; the same command run again finishes
  with one restart and a whole trail that verifies.
- Bug PF: a second restore read the key history before it took the stores alone. One
  that read it while the first was restarting the log (two real processes, the second
  paused between its read and its lock until the first finished) went on with the
  history of before the restart: it took the log for short, copied the backup over the
  first restore's stores, wrote its marker, and then failed in the key ring ("nothing to
  restart"), the marker left, every start refused. It now reads the history (and checks
  the manifest's signature against it) with the stores held alone: refused "nothing to
  restart", nothing changed.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from audit.keyring import parse_key_history, verify_key_history
from tests import children
from tests.children import run_python
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, cli_env, running
from tests.kernel.test_keys_apart import canaries, fill
from tests.kernel.test_restore_fork import _history, _pre_rotation_backup, _whole_trail
from tests.kernel.test_schema_lock_wait import HARNESS_WAIT_S, _flat, _until
from uprof.bootstrap import RestoreInterruptedError, build_key_material
from uprof.services.backup import restore
from uprof.settings import Settings
from uprof.storage import RESTORE_MARKER

RESTART = ("--allow-unsigned", "--restart-audit-log")

#: Where the restore dies: Python run in the restoring process before the command.
POINTS = {
    # Inside OD's check of the backup's log (verify_integrity without the anchor).
    "in-backup-log-check": """
        from audit.log import AuditLog
        check = AuditLog.verify_integrity
        def checked(self, *a, **k):
            if not k.get("against_anchor", True):
                os._exit(9)
            return check(self, *a, **k)
        AuditLog.verify_integrity = checked
        """,
    # The check passed; before the anchors are forgotten.
    "after-backup-log-check": """
        from audit.log import AuditLog
        check = AuditLog.verify_integrity
        def checked(self, *a, **k):
            check(self, *a, **k)
            if not k.get("against_anchor", True):
                os._exit(9)
        AuditLog.verify_integrity = checked
        """,
    # The audit log's anchor forgotten; before the restart is signed.
    "after-log-reanchor": """
        from audit.log import AuditLog
        forget = AuditLog.reanchor
        def forgotten(self, *a, **k):
            forget(self, *a, **k)
            os._exit(9)
        AuditLog.reanchor = forgotten
        """,
    # Half of the new key history written to its temporary file, not renamed.
    "mid-history-write": """
        import audit.keyring as keyring
        write = keyring._write_private
        def torn(path, data, **k):
            if path.name == "audit-keys.json":
                tmp = path.with_name(f".{path.name}.{os.getpid()}.torn.tmp")
                tmp.write_bytes(data[: len(data) // 2])
                os._exit(9)
            return write(path, data, **k)
        keyring._write_private = torn
        """,
    # The history written (the restart's commit point), the next key not yet the key.
    "after-history-write": """
        import audit.keyring as keyring
        write = keyring._write_private
        def written(path, data, **k):
            write(path, data, **k)
            if path.name == "audit-keys.json":
                os._exit(9)
        keyring._write_private = written
        """,
    # The restart signed and switched; inside the ledger's re-application.
    "in-ledger-reapply": """
        import uprof.services.recovery as recovery
        recovery.fingerprint_old_items = lambda *a, **k: os._exit(9)
        """,
}


def _history_on_disk(settings: Settings) -> dict[str, object]:
    """The key history as the file holds it, parsed and verified with the current key
    (``AuditKeyError`` or ``VerificationError`` if half-written or inconsistent)."""
    document = parse_key_history((settings.key_path / "audit-keys.json").read_bytes())
    material = build_key_material(settings)
    verify_key_history(document, [material.audit_keys().current().public_key()])
    return document  # type: ignore[no-any-return]


def _restarts(history: dict[str, object]) -> int:
    return sum("log_restart" in record for record in history["keys"])  # type: ignore[attr-defined]


@pytest.mark.parametrize("point", list(POINTS))
def test_a_restart_killed_at_each_step_leaves_whole_keys_and_is_finished(
    backend: Backend, clock: FakeClock, tmp_path: Path, point: str
) -> None:
    settings, before = _pre_rotation_backup(backend, clock, tmp_path)
    script = "import os\n" + textwrap.dedent(POINTS[point])
    script += "from uprof.cli.main import app\napp()\n"
    args = ("restore", "--from", str(tmp_path / "bk"), *RESTART)
    died = run_python(script, *args, env=cli_env(backend), timeout=180)
    assert died.returncode == 9, died.stdout + died.stderr[-3000:]

    # Never half-written: the history parses and verifies, with at most the one restart
    # (the commit point is the history's rename); the ledger reads.
    signed = point in ("after-history-write", "in-ledger-reapply")
    assert _restarts(_history_on_disk(settings)) == (1 if signed else 0)
    build_key_material(settings).erasure_records()
    assert (settings.data_dir / RESTORE_MARKER).exists()
    with pytest.raises(RestoreInterruptedError):
        build_kernel(settings, clock)

    report = restore(settings, tmp_path / "bk", allow_unsigned=True, restart_audit_log=True)
    assert report.audit_restarted_at == before.backup_size
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    with running(settings, clock) as k:
        fill(k, "dave", canaries("dave"))
        k.audit_log.verify_integrity()
        history = _history(k)
        restored = [e.entry for e in k.audit_log.entries(action="backup.restored")]
    assert [
        r["log_restart"]["abandoned"]["tree_size"] for r in history["keys"] if "log_restart" in r
    ] == [before.point]
    assert "audit-log-restarted" in restored[-1]["rule"]
    assert _whole_trail(settings, clock).rotation_points_checked >= 1


# ------------------------------------------------------------ two restores at once

#: ``uprof restore ...``, paused at ``--pause-at`` until the file ``go`` exists, having
#: said so with the file ``paused``: ``before-lock`` (the key history read, the stores
#: not yet held alone) or ``holding`` (the stores held alone, the copy not made).
_PAUSING = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    out, where = Path(sys.argv[1]), sys.argv[2]
    sys.argv = ["uprof", *sys.argv[3:]]

    def pause():
        (out / "paused").touch()
        while not (out / "go").exists():
            time.sleep(0.02)

    from uprof.backends import backend_for_settings
    from uprof.settings import Settings
    kind = type(backend_for_settings(Settings()))
    if where == "before-lock":
        alone = kind.stores_alone
        def paused_alone(self, *a, **k):
            pause()
            return alone(self, *a, **k)
        kind.stores_alone = paused_alone
    else:
        copy = kind.restore
        def paused_copy(self, *a, **k):
            pause()
            return copy(self, *a, **k)
        kind.restore = paused_copy
    from uprof.cli.main import app
    app()
    """
)


def _paused_restore(
    backend: Backend, out: Path, where: str, backup_dir: Path
) -> children.PythonChild:
    out.mkdir()
    args = ("restore", "--from", str(backup_dir), *RESTART)
    child = children.PythonChild(_PAUSING, str(out), where, *args, env=cli_env(backend))
    _until(f"the restore pauses {where}", lambda: (out / "paused").exists())
    return child


def _finished(child: children.PythonChild, out: Path) -> tuple[str, str]:
    (out / "go").touch()
    try:
        return child.communicate(HARNESS_WAIT_S * 3)
    finally:
        if child.returncode is None:
            child.kill()
            child.communicate(HARNESS_WAIT_S)


def _restore_cli(backend: Backend, backup_dir: Path) -> tuple[int, str]:
    done = run_python(
        "from uprof.cli.main import app\napp()\n",
        "restore",
        "--from",
        str(backup_dir),
        *RESTART,
        env=cli_env(backend),
        timeout=180,
    )
    return done.returncode, _flat(done.stderr)


def test_a_restore_beside_one_holding_the_stores_is_refused_changing_nothing(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Held: the first restore holds the stores alone (paused before its copy); a
    second, run then, is refused naming the stores in use and changes nothing; the
    first, resumed, finishes with one restart."""
    settings, before = _pre_rotation_backup(backend, clock, tmp_path)
    first = _paused_restore(backend, tmp_path / "first", "holding", tmp_path / "bk")
    marker = (settings.data_dir / RESTORE_MARKER).read_bytes()
    keys = (settings.key_path / "audit-keys.json").read_bytes()
    code, said = _restore_cli(backend, tmp_path / "bk")
    assert code != 0 and "Traceback" not in said, said
    assert "before a restore" in said, said
    assert (settings.data_dir / RESTORE_MARKER).read_bytes() == marker
    assert (settings.key_path / "audit-keys.json").read_bytes() == keys
    _, stderr = _finished(first, tmp_path / "first")
    assert first.returncode == 0, stderr[-3000:]
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    assert _restarts(_history_on_disk(settings)) == 1
    assert _whole_trail(settings, clock).rotation_points_checked >= 1
    assert before.backup_size > 0


def test_pf_a_restore_that_read_the_keys_before_another_restarted_the_log_changes_nothing(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """PF: the second restore read the key history, then the first restarted the log
    and finished; the second, resumed, must be refused as the history now says ("nothing
    to restart"), its marker never written, every start still served (main at 1a68357:
    it copied the backup over the first's stores, then failed in the key ring, the
    marker left)."""
    settings, before = _pre_rotation_backup(backend, clock, tmp_path)
    second = _paused_restore(backend, tmp_path / "second", "before-lock", tmp_path / "bk")
    code, said = _restore_cli(backend, tmp_path / "bk")
    assert code == 0, said
    with running(settings, clock) as k:
        size = k.audit_log.size()
    assert size < before.point  # the stale history would take this log for short
    keys = (settings.key_path / "audit-keys.json").read_bytes()

    _, stderr = _finished(second, tmp_path / "second")
    said = _flat(stderr)
    assert second.returncode == 1, (second.returncode, said[-3000:])
    assert "nothing to restart" in said and "nothing was changed" in said, said
    assert "Traceback" not in said, said
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    assert (settings.key_path / "audit-keys.json").read_bytes() == keys
    with running(settings, clock) as k:  # the first restore's stores, served
        assert k.audit_log.size() >= size
        k.audit_log.verify_integrity()
        fill(k, "dave", canaries("dave"))
    assert _restarts(json.loads(keys)) == 1
    assert _whole_trail(settings, clock).rotation_points_checked >= 1
