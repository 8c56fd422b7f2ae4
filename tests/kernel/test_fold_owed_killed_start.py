"""Review of 0125 (bug EV): a start killed while it waits to fold owes the fold all the same.

The start that destroys again what a restored key folder brought back, beside a reader of
``keys.sqlite``, commits the deletion and then tries the fold with its full patience
(``FOLD_TIMEOUT_S``) before it writes down that the fold is owed (DU's ``.fold-owed``
marker). Killed in that wait (kill -9, a Ctrl+C of the CLI command, a crash), it leaves
the deletion in the WAL, the erased subject's wrapped key in the main file, and nothing
that says so: the next start finds nothing to destroy again and owes nothing. Real
processes; SQLite only (PostgreSQL's WAL is the server's).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running, settings_for
from tests.kernel.sqlite_readers import (
    files_holding,
    files_holding_once_folded,
    key_store_put_back_after_erasure,
    reader_holding,
)
from tests.kernel.test_keys_apart import BOB, assert_intact
from uprof.settings import Settings

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)

#: Bounds on waits, not measured times.
PATIENCE_S = 60.0


def _start(settings: Settings) -> subprocess.Popen[bytes]:
    """A start on the folder, with the fold's usual patience (30 s beside the reader)."""
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from tests.fakes.ports import FakeClock
        from tests.kernel.conftest import build_kernel
        from uprof.settings import Settings
        settings = Settings(data_dir=Path({str(settings.data_dir)!r}), embedder="hashing")
        build_kernel(settings, FakeClock()).close()
        """
    )
    return subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _key_rows(keys_db: Path, stream: str) -> int:
    """The stream's key rows as a new connection sees them (in a child: FIELD-NOTES 8.1)."""
    script = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
        "print(c.execute('SELECT count(*) FROM subject_keys WHERE stream_id = ?', "
        "(sys.argv[2],)).fetchone()[0])"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(keys_db), stream],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return int(done.stdout)


def test_a_start_killed_while_it_waits_to_fold_leaves_the_fold_owed(
    backend: Backend, clock: FakeClock
) -> None:
    settings = settings_for(backend)
    keys_db = settings.key_path / "keys.sqlite"
    stream, wrapped = key_store_put_back_after_erasure(backend, settings, clock)
    with reader_holding(keys_db):
        start = _start(settings)
        try:
            deadline = time.monotonic() + PATIENCE_S
            while _key_rows(keys_db, stream) and time.monotonic() < deadline:
                assert start.poll() is None, "the start ended before destroying the keys"
                time.sleep(0.2)
            assert _key_rows(keys_db, stream) == 0  # destroyed again, committed
            # Now waiting for the reader to let it fold (30 s): killed there.
            assert start.poll() is None
            os.kill(start.pid, signal.SIGKILL)
        finally:
            start.kill()
            start.wait()
        assert "keys.sqlite" in files_holding(settings.key_path, wrapped)  # the fold is owed
    with running(settings, clock) as k:  # the next start, long-lived (a server)
        holding = files_holding_once_folded(settings.key_path, wrapped)
        # Still running: no file of the key folder holds the erased subject's key.
        assert holding == [], holding
        assert_intact(k, "bob", BOB)
