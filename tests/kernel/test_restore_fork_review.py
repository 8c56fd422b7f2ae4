"""Review of 0178: a killed restore run again with ``--restart-audit-log`` (bug NO).

0178 finishes a restart killed after its key history record: run again with the flag,
the restore sees the marker of a killed restore and a history whose highest point is a
restart's, at the live log's size, and takes the restart as done (``_Restart.DONE``),
recording ``audit-log-restarted``. But that state is also the one of a deployment that
restarted its log once, long before, and lost its data again: a *plain* restore of the
same backup, killed, then run again with the flag (an operator trying it after the
kill) was taken for a finished restart: the trail said the operator restarted the log
in this restore, which did not happen. Both backends, real processes."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.children import run_python
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import cli_env, running
from tests.kernel.test_keys_apart import canaries, fill
from tests.kernel.test_restore_bad_input import _empty_data_stores
from tests.kernel.test_restore_fork import _history, _pre_rotation_backup, _whole_trail
from tests.kernel.test_restore_killed import POINTS as RESTORE_POINTS
from uprof.services.backup import BackupError, restore
from uprof.storage import RESTORE_MARKER


def test_no_a_killed_plain_restore_run_again_with_the_flag_is_not_a_restart(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings, _before = _pre_rotation_backup(backend, clock, tmp_path)
    restore(settings, tmp_path / "bk", allow_unsigned=True, restart_audit_log=True)
    with running(settings, clock) as k:
        fill(k, "dave", canaries("dave"))
    _empty_data_stores(backend, settings)
    history_before = (settings.key_path / "audit-keys.json").read_bytes()

    # A plain restore of the same backup (it reaches the restart's point), killed after
    # its copy, in a real process.
    script = "import os\n" + textwrap.dedent(RESTORE_POINTS["after-copy"])
    script += "from uprof.cli.main import app\napp()\n"
    args = ("restore", "--from", str(tmp_path / "bk"), "--allow-unsigned")
    died = run_python(script, *args, env=cli_env(backend), timeout=180)
    assert died.returncode == 9, died.stdout + died.stderr[-3000:]
    assert (settings.data_dir / RESTORE_MARKER).exists()

    # Run again with the flag: there is nothing to restart, as without the kill.
    try:
        report = restore(settings, tmp_path / "bk", allow_unsigned=True, restart_audit_log=True)
    except BackupError as refused:
        assert "nothing to restart" in str(refused)
    else:  # main at ffab3cf: taken for a restart this restore made
        with running(settings, clock) as k:
            rules = [e.entry.get("rule") for e in k.audit_log.entries(action="backup.restored")]
        pytest.fail(
            f"a restore that restarted nothing reported a restart at "
            f"{report.audit_restarted_at}; its trail entry's rules: {rules[-1]}"
        )
    assert (settings.key_path / "audit-keys.json").read_bytes() == history_before
    assert (settings.data_dir / RESTORE_MARKER).exists()  # nothing changed: still killed
    # The plain command run again finishes it; one restart in the history, as before.
    report = restore(settings, tmp_path / "bk", allow_unsigned=True)
    assert report.audit_restarted_at is None
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    with running(settings, clock) as k:
        fill(k, "erin", canaries("erin"))
        restored = [e.entry for e in k.audit_log.entries(action="backup.restored")]
        history = _history(k)
    assert "audit-log-restarted" not in (restored[-1].get("rule") or [])
    assert sum("log_restart" in r for r in history["keys"]) == 1
    assert json.loads(history_before) == history
    assert _whole_trail(settings, clock).rotation_points_checked >= 1


def test_np_a_killed_restore_into_an_empty_folder_is_finished_by_running_it_again(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Bug NP: a restore into an empty data folder takes the backup's audit log and
    forgets the key folder's checkpoint anchor (``reanchor``). Killed after its copy, the
    command run again found the backup's log in place, kept it as the live one, and did
    not forget the anchor: refused with a VerificationError ("the log was rewritten or
    replaced"), and every start refused by the marker: the deployment could not be
    restored at all. No rotation is involved."""
    from tests.kernel.conftest import settings_for
    from tests.kernel.test_keys_apart import ALICE, BOB
    from uprof.services.backup import backup

    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
    backup(settings, tmp_path / "bk")
    with running(settings, clock) as k:
        fill(k, "bob", BOB)
        k.audit_log.checkpoint()  # the anchor moves past the backup's log
    _empty_data_stores(backend, settings)
    script = "import os\n" + textwrap.dedent(RESTORE_POINTS["after-copy"])
    script += "from uprof.cli.main import app\napp()\n"
    died = run_python(
        script, "restore", "--from", str(tmp_path / "bk"), env=cli_env(backend), timeout=180
    )
    assert died.returncode == 9, died.stdout + died.stderr[-3000:]
    restore(settings, tmp_path / "bk")
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    with running(settings, clock) as k:
        fill(k, "erin", canaries("erin"))
        k.audit_log.verify_integrity()
    assert _whole_trail(settings, clock).entry_count > 0
