"""No identifier in plaintext anywhere on disk (I9): session ids, identifiers, source
refs, subject refs and idempotency keys, on SQLite and PostgreSQL.

The raw files are read by a child process (never by this process while a kernel has
SQLite files open: closing a descriptor would drop this process's SQLite locks,
FIELD-NOTES 8.1). On PostgreSQL the database's own data files and the WAL segments
written during the test are scanned after a CHECKPOINT; if they cannot be read (not
the same machine, or not root) the test is skipped and says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import asdict
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.conftest import Backend
from tests.kernel.conftest import APP, consent, say
from uprof.kernel import Uprof

#: Runs in a child process: print, as JSON, which canaries occur in which files.
SCAN = r"""
import json, sys
from pathlib import Path
canaries = json.loads(sys.argv[1])
hits = {}
for name in sys.argv[2:]:
    path = Path(name)
    try:
        data = path.read_bytes()
    except OSError:
        continue
    for c in canaries:
        for needle in (c.encode(), c.encode("utf-16-le")):
            n = data.count(needle)
            if n:
                hits.setdefault(c, []).append([str(path), n])
print(json.dumps(hits))
"""


def scan_in_child(canaries: list[str], files: list[Path]) -> dict[str, list[list[object]]]:
    result = subprocess.run(
        [sys.executable, "-c", SCAN, json.dumps(canaries), *map(str, files)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    hits: dict[str, list[list[object]]] = json.loads(result.stdout)
    return hits


def plant(kernel: Uprof, tag: str) -> list[str]:
    """Write a subject through every path that takes an identifier; return the canaries."""
    subject = f"subj{tag}person"
    sessions = [f"sess{tag}{i}" for i in range(3)]
    refs = [f"ref{tag}{i}" for i in range(3)]
    identifier = f"mail{tag}@example.org"
    idem_key = f"idem{tag}key"
    consent(kernel, subject=subject)
    kernel.capture_many(
        subject,
        [say(f"I live in Lyon {i}", ref=refs[i], session=sessions[i]) for i in range(3)],
    )
    kernel.idempotent(
        APP,
        idem_key,
        "capture",
        {"n": 1},
        lambda token: (
            asdict(
                kernel.capture(
                    subject,
                    say("I like green tea", ref=refs[0], session=sessions[0]),
                    request_token=token,
                )
            ),
            201,
        ),
    )
    kernel.register_session(sessions[1], subject)
    kernel.register_identifier(identifier, subject)
    kernel.process()
    return [subject, *sessions, *refs, identifier, idem_key]


def test_no_identifier_in_plaintext_in_sqlite_files(backend: Backend, kernel: Uprof) -> None:
    if backend.kind != "sqlite":
        pytest.skip("the SQLite files; PostgreSQL has its own test below")
    tag = uuid.uuid4().hex[:10]
    canaries = plant(kernel, tag)

    def files() -> list[Path]:
        return [p for p in kernel.settings.data_dir.rglob("*") if p.is_file()]

    # Before erasure the views hold the subject's rows (and the WAL their writes).
    assert any(p.name.endswith("-wal") and p.stat().st_size for p in files())
    assert scan_in_child(canaries, files()) == {}
    kernel.erase_subject(canaries[0])
    assert scan_in_child(canaries, files()) == {}


def _postgres_files(kernel: Uprof, since: float) -> list[Path]:
    with kernel.views_engine.connect() as conn:
        data_dir = Path(conn.execute(sa.text("SHOW data_directory")).scalar_one())
        oid = conn.execute(
            sa.text("SELECT oid FROM pg_database WHERE datname = current_database()")
        ).scalar_one()
    base, wal = data_dir / "base" / str(oid), data_dir / "pg_wal"
    if not (os.access(base, os.R_OK | os.X_OK) and os.access(wal, os.R_OK | os.X_OK)):
        pytest.skip(f"PostgreSQL data files at {data_dir} are not readable from this process")
    files = [p for p in base.iterdir() if p.is_file()]
    # The WAL is shared by the cluster: scan the segments written during this test.
    files += [p for p in wal.iterdir() if p.is_file() and p.stat().st_mtime >= since - 2]
    return files


def test_no_identifier_in_plaintext_in_postgres_data_files_or_wal(
    backend: Backend, kernel: Uprof
) -> None:
    if backend.kind != "postgres":
        pytest.skip("PostgreSQL's data files; SQLite has its own test above")
    since = time.time()
    tag = uuid.uuid4().hex[:10]
    canaries = plant(kernel, tag)
    with kernel.views_engine.connect() as conn:
        conn.execute(sa.text("CHECKPOINT"))
    before = _postgres_files(kernel, since)
    assert any(p.parent.name == "pg_wal" for p in before)
    assert scan_in_child(canaries, before) == {}
    # Erasure leaves dead tuples (no VACUUM here): they hold ciphertext and hashes only.
    kernel.erase_subject(canaries[0])
    with kernel.views_engine.connect() as conn:
        conn.execute(sa.text("CHECKPOINT"))
    assert scan_in_child(canaries, _postgres_files(kernel, since)) == {}


def test_the_scan_finds_a_planted_plaintext_identifier(backend: Backend, kernel: Uprof) -> None:
    """The raw scan is not blind: a canary written in plaintext is found (both backends)."""
    since = time.time()
    tag = uuid.uuid4().hex[:10]
    leak = f"leak{tag}plain"
    with kernel.views_engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE leak_probe (v TEXT)"))
        conn.execute(sa.text("INSERT INTO leak_probe VALUES (:v)"), {"v": leak})
    if backend.kind == "postgres":
        with kernel.views_engine.connect() as conn:
            conn.execute(sa.text("CHECKPOINT"))
        files = _postgres_files(kernel, since)
    else:
        files = [p for p in kernel.settings.data_dir.rglob("*") if p.is_file()]
    assert leak in scan_in_child([leak], files)
