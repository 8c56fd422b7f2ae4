"""Erasure attacks, round 3: another process holds a read transaction on a SQLite store
(an operator's ``sqlite3`` shell, a backup tool, a scan) while a subject is erased.

The erasure's ``wal_checkpoint(TRUNCATE)`` cannot truncate the WAL while a reader holds
a snapshot: after its 30 s busy wait it returned "busy", which was ignored. The erasure
answered with a receipt while the key folder's ``keys.sqlite-wal`` still held the erased
subject's wrapped data key beside the KEK that unwraps it (and the event log keeps the
ciphertext forever): whoever copied or read the key folder then could read the erased
subject. An erasure must not claim to be done while a WAL holds what it deleted: it
answers ``erasure_incomplete``, and asking again once the reader is gone finishes it
with the receipt of the same request. SQLite only (PostgreSQL's WAL is the server's).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from audit.receipts import verify_receipt
from domain.errors import ErasureIncompleteError, SubjectErasedError
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running, settings_for
from tests.kernel.test_keys_apart import ALICE, BOB, assert_intact, fill

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


def _wrapped_keys(keys_db: Path, stream: str) -> list[bytes]:
    conn = sqlite3.connect(keys_db)
    try:
        rows = conn.execute("SELECT wrapped_dek FROM subject_keys WHERE stream_id = ?", (stream,))
        return [bytes(r[0]) for r in rows]
    finally:
        conn.close()


def _files_holding(folder: Path, wrapped: list[bytes]) -> list[str]:
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


def _reader(database: Path) -> subprocess.Popen[str]:
    """Another process with a read transaction open on ``database`` until killed."""
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
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)


def test_an_erasure_beside_a_reader_is_not_done_until_the_wal_is_folded(
    backend: Backend, clock: FakeClock
) -> None:
    settings = settings_for(backend)
    keys_db = settings.key_path / "keys.sqlite"
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        fill(k, "bob", BOB)
        wrapped = _wrapped_keys(keys_db, str(k.stream_of("alice")))
        assert wrapped
        reader = _reader(keys_db)
        try:
            assert reader.stdout is not None and reader.stdout.readline().strip() == "HOLD"
            with pytest.raises(ErasureIncompleteError):
                k.erase_subject("alice")
        finally:
            reader.kill()
            reader.wait()
            if reader.stdout is not None:
                reader.stdout.close()
        done = k.erase_subject("alice")  # asked again, the reader gone
        verify_receipt(done.receipt, k.audit_log.public_key, origin=k.audit_log.origin)
        # Still running (its connections open): no file of the key folder holds the key.
        holding = _files_holding(settings.key_path, wrapped)
        assert holding == [], holding
        with pytest.raises(SubjectErasedError):
            k.profile("alice")
        assert_intact(k, "bob", BOB)
        assert k.audit_log.verify_integrity() == k.audit_log.size()


def test_a_receipt_is_never_issued_while_the_wal_holds_the_key(
    backend: Backend, clock: FakeClock
) -> None:
    """The weaker claim on its own: whatever the erasure answers beside a reader, if it
    issues a receipt no file of the key folder may hold the destroyed key then."""
    settings = settings_for(backend)
    keys_db = settings.key_path / "keys.sqlite"
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        wrapped = _wrapped_keys(keys_db, str(k.stream_of("alice")))
        reader = _reader(keys_db)
        try:
            assert reader.stdout is not None and reader.stdout.readline().strip() == "HOLD"
            try:
                k.erase_subject("alice")
                receipted = True
            except ErasureIncompleteError:
                receipted = False
            holding = _files_holding(settings.key_path, wrapped)
            assert not (receipted and holding), holding
        finally:
            reader.kill()
            reader.wait()
            if reader.stdout is not None:
                reader.stdout.close()
