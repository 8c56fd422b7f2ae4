"""Review of 0123 (bug DU): a fold CU owes must outlive the process that owed it.

A start that destroys again what a restored key folder brought back, beside a reader of
``keys.sqlite``, folds in the background only while it runs. A short-lived process (a
CLI command, a start that fails later) ends with the fold still owed; the next start
finds nothing to destroy again and so owes nothing, and a server started then keeps the
erased subject's wrapped key in the key store's main file for as long as it runs (only
the last connection's close folds). SQLite only: PostgreSQL's WAL is the server's.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import uprof.backends.sqlite as sqlite_backend
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running, settings_for
from tests.kernel.test_erasure_beside_a_reader import _files_holding, _reader, _wrapped_keys
from tests.kernel.test_keys_apart import ALICE, BOB, assert_intact, fill
from uprof.settings import Settings

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)

#: How long the second start is given to fold (it retries every second); a bound on the
#: wait, not a measured time.
PATIENCE_S = 60.0


def _short_lived_start(settings: Settings) -> None:
    """A process that starts on the folder and ends at once (as a CLI command does)."""
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        import uprof.backends.sqlite as sqlite_backend
        from tests.fakes.ports import FakeClock
        from tests.kernel.conftest import build_kernel
        from uprof.settings import Settings
        sqlite_backend.FOLD_TIMEOUT_S = 2.0
        settings = Settings(data_dir=Path({str(settings.data_dir)!r}), embedder="hashing")
        build_kernel(settings, FakeClock()).close()
        """
    )
    subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parents[2],
        check=True,
        timeout=120,
        capture_output=True,
    )


def test_a_fold_owed_by_a_start_that_ended_is_done_by_the_next_start(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_backend, "FOLD_TIMEOUT_S", 2.0)
    settings = settings_for(backend)
    keys_db = settings.key_path / "keys.sqlite"
    old = backend.data_dir / "old-keys.sqlite"
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        fill(k, "bob", BOB)
        wrapped = _wrapped_keys(keys_db, str(k.stream_of("alice")))
        assert wrapped
    shutil.copy2(keys_db, old)
    with running(settings, clock) as k:
        k.erase_subject("alice")
    for suffix in ("-wal", "-shm"):
        keys_db.with_name("keys.sqlite" + suffix).unlink(missing_ok=True)
    shutil.copy2(old, keys_db)  # the key store put back from before the erasure
    reader = _reader(keys_db)
    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "HOLD"
        _short_lived_start(settings)  # re-destroys, cannot fold, and ends
        assert _files_holding(settings.key_path, wrapped) != []  # the fold is owed
    finally:
        reader.kill()
        reader.wait()
        if reader.stdout is not None:
            reader.stdout.close()
    with running(settings, clock) as k:  # the next start, long-lived (a server)
        deadline = time.monotonic() + PATIENCE_S
        holding = _files_holding(settings.key_path, wrapped)
        while holding and time.monotonic() < deadline:
            time.sleep(1.0)
            holding = _files_holding(settings.key_path, wrapped)
        # Still running: no file of the key folder holds the erased subject's key.
        assert holding == [], holding
        assert_intact(k, "bob", BOB)
