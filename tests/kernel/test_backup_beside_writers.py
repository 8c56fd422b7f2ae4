"""``uprof backup`` while other real processes write, then ``uprof restore`` (decision
0149-upgrade-and-backup-processes), both backends.

A writer process captures for bob in a loop and changes the policy, another process
erases alice, and ``uprof backup`` (the command, a process of its own) runs meanwhile.
Restored after they stopped: the deployment starts (every anchor matches its stream),
the audit log verifies, every capture acknowledged before the backup began is served,
the policy store reads whole, and alice stays erased (the erasure's ledger re-applied).
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest

from domain.errors import SubjectErasedError
from tests.children import CLI_SCRIPT, PythonChild, progress_count, run_python
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, cli_env
from tests.kernel.test_keys_apart import BOB, filled_deployment

_WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tests.conftest import Backend
    from tests.fakes.ports import FakeClock
    from tests.kernel.conftest import build_kernel, say, settings_for

    backend = Backend(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
    progress, stop = Path(sys.argv[4]), Path(sys.argv[5])
    kernel = build_kernel(settings_for(backend), FakeClock())
    try:
        i = 0
        while not stop.exists() or i < 6:
            kernel.capture("bob", say(f"note Qzxwrite{i:03d}", ref=f"w{i}"))
            kernel.process()
            i += 1
            if i == 3:
                kernel.policy_grant(
                    requested_by="test", role="role:assistant", actions=["read"],
                    categories=["contact"], purpose="scheduling",
                )
            progress.write_text(str(i))
    finally:
        kernel.close()
    """
)


def _wait_for(progress: Path, at_least: int, writer: PythonChild) -> int:
    while (n := progress_count(progress)) < at_least:
        assert writer.poll() is None, writer.communicate()[1][-3000:]
        time.sleep(0.05)
    return n


def test_a_backup_taken_beside_writers_restores_consistent(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = filled_deployment(backend, clock, "alice", "bob")
    progress, stop, bk = tmp_path / "progress", tmp_path / "stop", tmp_path / "bk"
    args = (backend.kind, backend.url, str(backend.data_dir), str(progress), str(stop))
    writer = PythonChild(_WRITER, *args)
    eraser: PythonChild | None = None
    try:
        before = _wait_for(progress, 2, writer)
        eraser = PythonChild(
            textwrap.dedent(
                """
                import sys
                from pathlib import Path
                from tests.conftest import Backend
                from tests.fakes.ports import FakeClock
                from tests.kernel.conftest import build_kernel, settings_for
                backend = Backend(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
                kernel = build_kernel(settings_for(backend), FakeClock())
                try:
                    kernel.erase_subject("alice")
                finally:
                    kernel.close()
                """
            ),
            *args[:3],
        )
        made = run_python(CLI_SCRIPT, "backup", "--to", str(bk), env=cli_env(backend), timeout=180)
        assert made.returncode == 0, made.stdout + made.stderr[-3000:]
    finally:
        stop.touch()
        _, err = writer.communicate(timeout=180)
        assert writer.returncode == 0, err[-3000:]
        if eraser is not None:
            _, err = eraser.communicate(timeout=180)
            assert eraser.returncode == 0, err[-3000:]
    assert progress_count(progress) >= 6

    put_back = run_python(
        CLI_SCRIPT, "restore", "--from", str(bk), env=cli_env(backend), timeout=180
    )
    assert put_back.returncode == 0, put_back.stdout + put_back.stderr[-3000:]

    k = build_kernel(settings, clock)
    try:
        k.audit_log.verify_integrity()
        export = json.dumps(k.export_subject("bob"))
        assert all(v in export for v in BOB.values())
        acknowledged = [f"Qzxwrite{i:03d}" for i in range(before)]
        assert all(a in export for a in acknowledged), acknowledged
        for read in (lambda: k.profile("alice"), lambda: k.export_subject("alice")):
            with pytest.raises(SubjectErasedError):
                read()
        assert k.policy_service is not None
        k.policy_service.app.check_every_stream()
    finally:
        k.close()
