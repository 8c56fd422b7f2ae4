"""The residue scan never costs a live store its locks (FIELD-NOTES 8.1, issue 14).

The incident: a scan inside the server read the live SQLite files with plain reads;
closing them dropped the server's POSIX locks; the next CLI process took itself for
the last connection, checkpointed and deleted the WAL; the server's later writes went
to the deleted file and no new process ever saw them. These tests replay it with
real processes, and pin the byte-level coverage the scan must keep.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Backend
from tests.kernel.conftest import settings_for
from uprof.kernel import Uprof
from uprof.services import residue
from uprof.services.residue import ResidueReport, ResidueScanError, scan_files

REPO = Path(__file__).resolve().parents[2]
ANSWER_TIMEOUT_S = 120
sqlite_only = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
needs_proc_locks = pytest.mark.skipif(
    not Path("/proc/locks").exists(), reason="needs Linux /proc/locks"
)


def _env(backend: Backend) -> dict[str, str]:
    settings = settings_for(backend)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "UPROF_DATA_DIR": str(settings.data_dir),
        "UPROF_EMBEDDER": "hashing",
    }
    env.pop("UPROF_DATABASE_URL", None)
    if settings.database_url:
        env["UPROF_DATABASE_URL"] = settings.database_url
    return env


class Holder:
    """A process holding a kernel (see residue_holder), driven one command at a time."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.kernel.residue_holder"],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self._read()["pid"]

    def ask(self, **command: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the process answers or dies; no sleep
        if not line:
            raise AssertionError(f"holder exited with {self.proc.wait(ANSWER_TIMEOUT_S)}")
        return json.loads(line)

    def close(self) -> None:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        if not stdin.closed:
            try:
                stdin.write(json.dumps({"op": "quit"}) + "\n")
                stdin.close()
            except BrokenPipeError:
                pass  # it died already; wait() reports how
        self.proc.wait(ANSWER_TIMEOUT_S)
        stdout.close()


@pytest.fixture
def holder(backend: Backend) -> Iterator[Holder]:
    h = Holder(_env(backend))
    try:
        yield h
    finally:
        h.close()


def _cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", "from uprof.cli.main import app; app()", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=ANSWER_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _open_and_close(db: Path) -> None:
    script = (
        "import sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1])\n"
        "c.execute('SELECT count(*) FROM sqlite_master').fetchall()\n"
        "c.close()\n"
    )
    subprocess.run([sys.executable, "-c", script, str(db)], check=True, timeout=ANSWER_TIMEOUT_S)


def _database_files(data_dir: Path) -> list[Path]:
    return sorted(p for p in data_dir.glob("*.sqlite*"))


def _locks_of(pid: int, paths: list[Path]) -> set[tuple[str, str, str]]:
    """The POSIX locks pid holds on these files: (file name, kind, byte range)."""
    inodes = {os.stat(p).st_ino: p.name for p in paths if p.exists()}
    held = set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if fields[1] != "POSIX" or fields[4] != str(pid):
            continue
        inode = int(fields[5].rsplit(":", 1)[1])
        if inode in inodes:
            held.add((inodes[inode], fields[3], f"{fields[6]}-{fields[7]}"))
    return held


def test_scan_in_a_writing_process_then_another_process_loses_nothing(
    backend: Backend, holder: Holder
) -> None:
    """A scans, B (a CLI process) opens and closes the store, A writes, C sees it all."""
    env = _env(backend)
    data_dir = settings_for(backend).data_dir
    acked = [holder.ask(op="write", subject="alice", text="I live in Qzxbeforecanary")]
    report = holder.ask(op="scan", terms=["Qzxnotpresent"])
    assert report["findings"] == []
    # B: a CLI process opens every store and closes it; then a plain SQLite client does
    # the same (as an operator's `sqlite3 events.sqlite .tables` would). Either one,
    # believing itself the last connection, may checkpoint and delete the WAL.
    assert '"caught_up"' in _cli(env, "projections", "lag")  # it ran, on this store
    if backend.kind == "sqlite":
        for db in ("events.sqlite", "views.sqlite", "policies.sqlite"):
            _open_and_close(data_dir / db)
        wals = [p.name for p in _database_files(data_dir) if p.name.endswith("-wal")]
        # The data folder's stores (the key store lives in the key folder, decision 0012).
        assert sorted(wals) == ["events.sqlite-wal", "policies.sqlite-wal", "views.sqlite-wal"]
    acked.append(holder.ask(op="write", subject="alice", text="I moved to Qzxaftercanary"))
    acked.append(holder.ask(op="write", subject="bob", text="I live in Oslo"))
    fds = holder.ask(op="fds")["fds"]
    mine = [fd for fd in fds if fd.startswith(str(data_dir))]
    assert mine or backend.kind == "postgres"  # the probe sees the store's descriptors
    assert [fd for fd in mine if fd.endswith("(deleted)")] == []
    reader = Holder(env)  # C: a fresh process
    try:
        seen = reader.ask(
            op="read", subjects=["alice", "bob"], capture_ids=[a["capture_id"] for a in acked]
        )
    finally:
        reader.close()
    assert seen["subjects"] == ["alice", "bob"]
    assert seen["capture_ids"] == sorted(a["capture_id"] for a in acked)


@sqlite_only
@needs_proc_locks
def test_scan_keeps_every_lock_of_the_scanning_process(kernel: Uprof, backend: Backend) -> None:
    from tests.kernel.conftest import consent, say

    consent(kernel)
    kernel.capture("alice", say("I live in Qzxlockcanary"))
    files = _database_files(settings_for(backend).data_dir)
    before = _locks_of(os.getpid(), files)
    assert {name for name, _, _ in before} >= {"events.sqlite", "events.sqlite-shm"}
    report = kernel.residue_scan(["Qzxnotpresent"])
    assert report.clean, report.findings
    assert _locks_of(os.getpid(), files) >= before
    # The probe is sensitive: one plain open and close of a live file drops them.
    shm = settings_for(backend).data_dir / "events.sqlite-shm"
    shm.open("rb").close()
    assert not any(name == "events.sqlite-shm" for name, _, _ in _locks_of(os.getpid(), files))


def _live_db(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA secure_delete=OFF")  # let deleted bytes linger on purpose
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, body TEXT)")
    return conn


@needs_proc_locks
def test_scan_finds_deleted_bytes_in_the_wal_and_in_free_space(tmp_path: Path) -> None:
    """Deleted rows are gone from any logical copy; the raw scan must still see them."""
    conn = _live_db(tmp_path / "live.sqlite")
    try:
        conn.execute("INSERT INTO notes (body) VALUES ('Qzxwalonlycanary')")
        conn.execute("DELETE FROM notes")
        assert conn.execute("SELECT count(*) FROM notes").fetchone() == (0,)
        files = _database_files(tmp_path)
        before = _locks_of(os.getpid(), files)
        report = ResidueReport()
        scan_files(tmp_path, ["Qzxwalonlycanary"], report)
        assert any("live.sqlite-wal@" in f.location for f in report.findings), report.findings
        assert not any(" table " in f.location for f in report.findings)
        assert _locks_of(os.getpid(), files) >= before
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the page goes home, deleted bytes too
        report = ResidueReport()
        scan_files(tmp_path, ["Qzxwalonlycanary"], report)
        assert any(f.location.startswith(f"{tmp_path / 'live.sqlite'}@") for f in report.findings)
    finally:
        conn.close()


def _straddling_db(path: Path, term: str) -> None:
    """A row whose value holds term across an overflow-page border (not contiguous on disk)."""
    length = 14_000  # a fixed length fixes where the value spills to overflow pages
    for offset in range(1000, length - len(term)):
        path.unlink(missing_ok=True)
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA journal_mode=OFF")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("CREATE TABLE notes (body TEXT)")
        text = "x" * offset + term + "y" * (length - offset - len(term))
        conn.execute("INSERT INTO notes VALUES (?)", (text,))
        conn.commit()
        conn.close()
        if term.encode() not in path.read_bytes():  # closed, no connection: safe to read
            return
    raise AssertionError("no offset split the term")


def test_scan_finds_a_value_split_across_overflow_pages(tmp_path: Path) -> None:
    _straddling_db(tmp_path / "split.sqlite", "Qzxsplitcanary")
    report = ResidueReport()
    scan_files(tmp_path, ["Qzxsplitcanary"], report)
    assert [f.location for f in report.findings] == [
        f"{tmp_path / 'split.sqlite'} table notes.body row 0"
    ]
    assert report.tables_scanned == 1


def test_a_database_under_another_name_is_found_by_its_header(tmp_path: Path) -> None:
    _straddling_db(tmp_path / "split.sqlite", "Qzxsplitcanary")
    (tmp_path / "split.sqlite").rename(tmp_path / "export.bak")
    report = ResidueReport()
    scan_files(tmp_path, ["Qzxsplitcanary"], report)
    assert [f.location for f in report.findings] == [
        f"{tmp_path / 'export.bak'} table notes.body row 0"
    ]


def test_scanning_a_closed_copy_leaves_its_wal_as_it_was(tmp_path: Path) -> None:
    """The child's connection is read-only: as last connection it checkpoints nothing."""
    script = (
        "import os, sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('PRAGMA journal_mode=WAL'); c.execute('PRAGMA wal_autocheckpoint=0')\n"
        "c.execute('CREATE TABLE notes (body TEXT)')\n"
        "c.execute(\"INSERT INTO notes VALUES ('Qzxcopycanary')\")\n"
        "os._exit(0)  # like a copy taken while a server ran: the WAL is left behind\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "copy.sqlite")], check=True)
    wal = tmp_path / "copy.sqlite-wal"
    before = wal.read_bytes()  # no connection to it in this process
    report = ResidueReport()
    scan_files(tmp_path, ["Qzxcopycanary"], report)
    locations = {f.location.split("@")[0] for f in report.findings}
    assert locations == {str(wal), f"{tmp_path / 'copy.sqlite'} table notes.body row 0"}
    assert wal.read_bytes() == before


def test_a_scan_that_cannot_run_raises_instead_of_passing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(residue, "_CHILD", tmp_path / "missing.py")
    with pytest.raises(ResidueScanError, match="file scan failed"):
        scan_files(tmp_path, ["anything"], ResidueReport())


def test_the_terms_do_not_appear_on_the_child_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[str]] = []
    real_run = subprocess.run

    def spy(args: list[str], **kw: Any) -> Any:
        seen.append(list(args))
        return real_run(args, **kw)

    monkeypatch.setattr(residue.subprocess, "run", spy)
    scan_files(tmp_path, ["Qzxsecretterm"], ResidueReport())
    assert seen and not any("Qzxsecretterm" in arg for arg in seen[0])
