"""``uprof restore --restart-audit-log`` killed (``os._exit``, no cleanup, as kill -9) in a
real process, before its restart, after the restart's key history record (before its
audit entry), and after its last audit entry: every start refuses while the marker stays,
and the same command run again finishes it with one restart in the key history and a
whole trail that verifies. Both backends."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.children import run_python
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, cli_env, running
from tests.kernel.test_keys_apart import canaries, fill
from tests.kernel.test_restore_fork import _history, _pre_rotation_backup, _whole_trail
from tests.kernel.test_restore_killed import POINTS as RESTORE_POINTS
from uprof.bootstrap import RestoreInterruptedError
from uprof.services.backup import restore
from uprof.storage import RESTORE_MARKER

POINTS = {
    "after-copy": RESTORE_POINTS["after-copy"],
    "after-restart-record": """
        import uprof.kernel as kernel
        kernel._rotation_entries = lambda *a, **k: os._exit(9)
        """,
    "after-audit-entry": RESTORE_POINTS["after-audit-entry"],
}


@pytest.mark.parametrize("point", list(POINTS))
def test_a_restart_killed_at_each_step_is_finished_by_running_it_again(
    backend: Backend, clock: FakeClock, tmp_path: Path, point: str
) -> None:
    settings, before = _pre_rotation_backup(backend, clock, tmp_path)
    script = "import os\n" + textwrap.dedent(POINTS[point])
    script += "from uprof.cli.main import app\napp()\n"
    args = ("restore", "--from", str(tmp_path / "bk"), "--allow-unsigned", "--restart-audit-log")
    died = run_python(script, *args, env=cli_env(backend), timeout=180)
    assert died.returncode == 9, died.stdout + died.stderr[-3000:]
    assert (settings.data_dir / RESTORE_MARKER).exists()
    with pytest.raises(RestoreInterruptedError):
        build_kernel(settings, clock)
    written = json.loads((settings.key_path / "audit-keys.json").read_text())
    assert sum("log_restart" in r for r in written["keys"]) == (point != "after-copy")

    report = restore(settings, tmp_path / "bk", allow_unsigned=True, restart_audit_log=True)
    assert report.audit_restarted_at == before.backup_size
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    with running(settings, clock) as k:
        fill(k, "dave", canaries("dave"))
        assert k.audit_log.size() > before.point
        k.audit_log.verify_integrity()
        history = _history(k)
        restored = [e.entry for e in k.audit_log.entries(action="backup.restored")]
    assert [
        r["log_restart"]["abandoned"]["tree_size"] for r in history["keys"] if "log_restart" in r
    ] == [before.point]
    assert "audit-log-restarted" in restored[-1]["rule"]
    assert _whole_trail(settings, clock).rotation_points_checked >= 1
