"""``uprof restore`` killed (``os._exit``, no cleanup, as kill -9) at each step, in a real
process, both backends (decision 0149-upgrade-and-backup-processes).

The backup is taken before alice's erasure. Killed before the copy, after it, before the
erasure ledger is re-applied (alice's data readable in the stores again) or after the
audit entry: every start refuses while the marker stays, and ``uprof restore`` run again
finishes it, with alice erased, bob served and the audit log whole.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from domain.errors import SubjectErasedError
from tests.children import run_python
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, cli_env
from tests.kernel.test_keys_apart import BOB, assert_intact, filled_deployment
from uprof.bootstrap import RestoreInterruptedError
from uprof.services.backup import backup, restore
from uprof.storage import RESTORE_MARKER

#: Where the restore dies: Python run in the restoring process before the command.
POINTS = {
    "before-copy": """
        from uprof.backends import backend_for_settings
        from uprof.settings import Settings
        kind = type(backend_for_settings(Settings()))
        kind.restore = lambda *a, **k: os._exit(9)
        """,
    "after-copy": """
        from uprof.backends import backend_for_settings
        from uprof.settings import Settings
        kind = type(backend_for_settings(Settings()))
        copy = kind.restore
        def copied(*a, **k):
            copy(*a, **k)
            os._exit(9)
        kind.restore = copied
        """,
    "before-ledger": """
        import uprof.services.recovery as recovery
        recovery.reapply_ledger = lambda *a, **k: os._exit(9)
        """,
    "after-audit-entry": """
        from audit.log import AuditLog
        check = AuditLog.verify_integrity
        def checked(self, *a, **k):
            check(self, *a, **k)
            if k.get("against_anchor", True):  # the last check, not the backup log's first
                os._exit(9)
        AuditLog.verify_integrity = checked
        """,
}


@pytest.mark.parametrize("point", list(POINTS))
def test_a_restore_killed_at_each_step_is_finished_by_running_it_again(
    backend: Backend, clock: FakeClock, tmp_path: Path, point: str
) -> None:
    settings = filled_deployment(backend, clock, "alice", "bob")
    backup(settings, tmp_path / "bk")
    k = build_kernel(settings, clock)
    k.erase_subject("alice")
    k.close()

    script = "import os\n" + textwrap.dedent(POINTS[point])
    script += "from uprof.cli.main import app\napp()\n"
    died = run_python(
        script, "restore", "--from", str(tmp_path / "bk"), env=cli_env(backend), timeout=180
    )
    assert died.returncode == 9, died.stdout + died.stderr[-3000:]
    assert (settings.data_dir / RESTORE_MARKER).exists()
    with pytest.raises(RestoreInterruptedError):
        build_kernel(settings, clock)

    restore(settings, tmp_path / "bk")
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    k = build_kernel(settings, clock)
    try:
        k.audit_log.verify_integrity()
        assert_intact(k, "bob", BOB)
        for read in (lambda: k.profile("alice"), lambda: k.export_subject("alice")):
            with pytest.raises(SubjectErasedError):
                read()
    finally:
        k.close()
