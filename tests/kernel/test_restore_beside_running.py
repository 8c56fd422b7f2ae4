"""``uprof restore`` beside a running uprof process on the same stores.

The docs said "stop every uprof process first" and nothing enforced it. With a server
still running, a restore went ahead: on SQLite the running process's acknowledged
captures made after the backup were silently rolled back under it (and a capture
acknowledged during the copy could land between the views and the log); on PostgreSQL
``pg_restore --clean`` dropped and re-created the types the running process had cached,
and every later capture of that process failed ("cache lookup failed for type").
Now every process holds the stores open (a shared lock) and a restore takes them alone
or refuses, changing nothing; a start while a restore holds them is refused.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from domain.errors import UprofError
from tests.children import PythonChild
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, say, settings_for
from tests.kernel.test_keys_apart import BOB, fill
from tests.kernel.test_restore_bad_input import _deployment_with_a_backup
from uprof.backends import StoresInUseError
from uprof.bootstrap import RestoreInterruptedError
from uprof.services.backup import backup, restore
from uprof.storage import RESTORE_MARKER


def test_a_restore_beside_a_running_process_refuses_and_changes_nothing(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = settings_for(backend)
    running = build_kernel(settings, clock)  # a server that was not stopped
    try:
        fill(running, "bob", BOB)
        backup(settings, tmp_path / "bk")
        acked = running.capture("bob", say("acknowledged after the backup Qzxafter"))
        running.process()
        error: UprofError | None = None
        try:
            restore(settings, tmp_path / "bk")
        except UprofError as e:
            error = e
        assert not (settings.data_dir / RESTORE_MARKER).exists()
        # The running process goes on, and loses nothing it acknowledged.
        running.capture("bob", say("acknowledged after the refusal Qzxlater"))
        running.process()
        export = json.dumps(running.export_subject("bob"))
        assert "Qzxafter" in export and "Qzxlater" in export
        assert acked.capture_id in export
        assert isinstance(error, StoresInUseError) and "stop" in str(error), error
    finally:
        running.close()
    # Stopped, the restore runs.
    restore(settings, tmp_path / "bk")
    k = build_kernel(settings, clock)
    try:
        assert "Qzxafter" not in json.dumps(k.export_subject("bob"))  # a rollback, as asked
    finally:
        k.close()


def _holding_a_kernel(backend: Backend, then: str) -> subprocess.Popen[str]:
    """Another real process with a kernel open on the backend's stores, once it said so;
    it then runs ``then`` (Python, ``kernel`` bound)."""
    script = (
        textwrap.dedent(
            f"""
        import sys, time
        from pathlib import Path
        from tests.conftest import Backend
        from tests.fakes.ports import FakeClock
        from tests.kernel.conftest import build_kernel, settings_for

        b = Backend({backend.kind!r}, {backend.url!r}, Path({str(backend.data_dir)!r}))
        kernel = build_kernel(settings_for(b), FakeClock())
        print("ready", flush=True)
        """
        )
        + then
        + "\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def test_a_restore_refuses_while_another_real_process_runs(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = _deployment_with_a_backup(backend, clock, tmp_path)
    child = _holding_a_kernel(backend, "sys.stdin.readline()\nkernel.close()")
    try:
        with pytest.raises(StoresInUseError):
            restore(settings, tmp_path / "bk")
    finally:
        child.communicate("\n", timeout=120)
    assert child.returncode == 0
    restore(settings, tmp_path / "bk")  # the other process stopped: it runs


def test_a_start_while_a_restore_holds_the_stores_is_refused(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    from uprof.backends import backend_for_settings
    from uprof.storage import create_engine, layout_for

    settings = settings_for(backend)
    build_kernel(settings, clock).close()
    views = create_engine(layout_for(settings).views_url)
    try:
        with backend_for_settings(settings).stores_alone(views):
            with pytest.raises(RestoreInterruptedError, match="restore"):
                build_kernel(settings, clock)
    finally:
        views.dispose()
    build_kernel(settings, clock).close()  # released: starts again


def test_a_process_killed_with_sigkill_holds_nothing(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """kill -9 leaves no cleanup: the lock goes with the descriptor (SQLite) or the session
    (PostgreSQL), so a restore after it is not refused for ever."""
    settings = _deployment_with_a_backup(backend, clock, tmp_path)
    child = _holding_a_kernel(backend, "time.sleep(600)")
    try:
        with pytest.raises(StoresInUseError):
            restore(settings, tmp_path / "bk")
    finally:
        child.kill()
        child.communicate(timeout=30)  # reaped, its pipes closed
    deadline = time.monotonic() + 10  # the server notices a dead client's socket at once
    while True:
        try:
            restore(settings, tmp_path / "bk")
            break
        except StoresInUseError:
            assert time.monotonic() < deadline, "the killed process's lock was never released"
            time.sleep(0.1)


def test_a_backup_of_stores_an_interrupted_restore_left_is_refused(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """A restore killed half-way leaves its marker and half-replaced stores: a backup
    written from them would carry checksums that vouch for a store no start would open.
    Until 2026-12-04 ``uprof backup`` wrote it."""
    settings = settings_for(backend)
    build_kernel(settings, clock).close()
    marker = settings.data_dir / RESTORE_MARKER
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text('{"from": "elsewhere"}\n', encoding="utf-8")  # as a killed restore
    with pytest.raises(RestoreInterruptedError, match="restore"):
        backup(settings, tmp_path / "bk")
    assert not (tmp_path / "bk").exists()
    assert not list(tmp_path.glob(".bk.partial-*"))
    marker.unlink()
    backup(settings, tmp_path / "bk")  # finished (here: removed), it runs


def test_a_restore_refuses_while_another_process_writes_a_backup(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """A backup reads the stores for a while (SQLite's backup API, pg_dump): a restore
    then replaced them under it, and the backup's files mixed the two. The backup holds
    the stores open as a running process does, and the restore refuses."""
    settings = _deployment_with_a_backup(backend, clock, tmp_path)
    gate = tmp_path / "gate"
    gate.mkdir()
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from tests.conftest import Backend
        from tests.kernel.conftest import settings_for
        from uprof.backends import backend_for_settings
        from uprof.services.backup import backup

        b = Backend({backend.kind!r}, {backend.url!r}, Path({str(backend.data_dir)!r}))
        settings = settings_for(b)
        gate = Path({str(gate)!r})
        kind = type(backend_for_settings(settings))
        copy = kind.backup

        def slow_copy(self, settings, folder):
            (gate / "reading").touch()
            while not (gate / "go").exists():
                time.sleep(0.01)
            return copy(self, settings, folder)

        kind.backup = slow_copy
        backup(settings, Path({str(tmp_path / "second")!r}))
        print("written")
        """
    )
    child = PythonChild(script)
    try:
        deadline = time.monotonic() + 120
        while not (gate / "reading").exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the backup never started reading"
            time.sleep(0.01)
        with pytest.raises(StoresInUseError):
            restore(settings, tmp_path / "bk")
        assert not (settings.data_dir / RESTORE_MARKER).exists()
    finally:
        (gate / "go").touch()
        out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err[-3000:]
    assert out.strip() == "written"
    restore(settings, tmp_path / "second")  # the backup ended: the restore runs
