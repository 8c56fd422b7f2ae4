"""Set-ups for the tests of folds beside other processes (SQLite only).

A fold of a SQLite log (``wal_checkpoint(TRUNCATE)``) cannot finish while another
process holds a read transaction; these tests hold one in a real process, look for an
erased subject's wrapped keys in the files, and put back key stores copied before an
erasure. One place for them, so every such test holds, looks and restores the same way.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running
from tests.kernel.test_keys_apart import ALICE, BOB, fill
from uprof.settings import Settings


def wrapped_keys(keys_db: Path, stream: str) -> list[bytes]:
    """The wrapped DEKs of ``stream`` as the key store holds them."""
    conn = sqlite3.connect(keys_db)
    try:
        rows = conn.execute("SELECT wrapped_dek FROM subject_keys WHERE stream_id = ?", (stream,))
        return [bytes(r[0]) for r in rows]
    finally:
        conn.close()


def files_holding(folder: Path, wrapped: list[bytes]) -> list[str]:
    """Files of ``folder`` holding any of ``wrapped``, read by a child process: a plain
    open and close of a live SQLite file here would drop this process's SQLite locks
    (FIELD-NOTES 8.1)."""
    script = textwrap.dedent(
        f"""
        import json
        from pathlib import Path
        wrapped = [bytes.fromhex(h) for h in {[w.hex() for w in wrapped]!r}]
        folder = Path({str(folder)!r})
        print(json.dumps([
            p.name for p in sorted(folder.iterdir())
            if p.is_file() and any(w in p.read_bytes() for w in wrapped)
        ]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    found: list[str] = json.loads(done.stdout)
    return found


#: How long a running service is given to fold a store it owes (it retries every second);
#: a bound on the wait, not a measured time.
FOLD_PATIENCE_S = 60.0


def files_holding_once_folded(folder: Path, wrapped: list[bytes]) -> list[str]:
    """``files_holding``, asked every second until no file holds the keys or
    ``FOLD_PATIENCE_S`` passed: what still holds them then (``[]``: folded in time)."""
    deadline = time.monotonic() + FOLD_PATIENCE_S
    holding = files_holding(folder, wrapped)
    while holding and time.monotonic() < deadline:
        time.sleep(1.0)
        holding = files_holding(folder, wrapped)
    return holding


@contextmanager
def reader_holding(database: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process with a read transaction open on ``database`` for the block (it
    may be killed earlier: killing it again at the end is harmless)."""
    script = textwrap.dedent(
        f"""
        import sqlite3, time
        conn = sqlite3.connect({str(database)!r}, isolation_level=None)
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
        print("HOLD", flush=True)
        time.sleep(3600)
        """
    )
    reader = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "HOLD"
        yield reader
    finally:
        reader.kill()
        reader.wait()
        if reader.stdout is not None:
            reader.stdout.close()


def short_lived_start(settings: Settings) -> None:
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


def key_store_put_back_after_erasure(
    backend: Backend, settings: Settings, clock: FakeClock, *, bystander: bool = True
) -> tuple[str, list[bytes]]:
    """Fill alice (and bob, a bystander), copy the closed key store aside, erase alice,
    then put the copy back (the key store restored from before the erasure). Returns
    alice's stream and wrapped keys, which the next start must destroy again."""
    keys_db = settings.key_path / "keys.sqlite"
    old = backend.data_dir / "old-keys.sqlite"
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        if bystander:
            fill(k, "bob", BOB)
        stream = str(k.stream_of("alice"))
        wrapped = wrapped_keys(keys_db, stream)
    assert wrapped
    # Closed: the key store is one file again; the copy an operator restores later.
    assert not keys_db.with_name("keys.sqlite-wal").exists()
    shutil.copy2(keys_db, old)
    with running(settings, clock) as k:
        k.erase_subject("alice")
    for suffix in ("-wal", "-shm"):
        keys_db.with_name("keys.sqlite" + suffix).unlink(missing_ok=True)
    shutil.copy2(old, keys_db)
    old.unlink()
    return stream, wrapped
