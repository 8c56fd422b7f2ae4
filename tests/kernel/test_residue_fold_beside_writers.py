"""The residue scan's own fold (decision 0130, bug FV's fix) beside writing processes
(review of 0130; real processes, SQLite: PostgreSQL's log is not ours to fold).

The scan now runs a truncating checkpoint of every store. Attacked as the compliance
caller who runs it again and again in a live deployment: two processes scanning in a
loop, two processes writing captures in a loop, and a fourth process holding a read
transaction on the event log the whole time, so that every fold of it retries for its
full bound (``SCAN_FOLD_TIMEOUT_S``; each try holds the file's write lock for up to
``FOLD_TRY_MS``). Every
write acknowledged must be seen by a fresh process afterwards, no write may fail, and
no write may wait anywhere near the connections' 30 s busy timeout.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any

import pytest

from tests.conftest import Backend
from tests.kernel.conftest import settings_for
from tests.kernel.test_residue_processes import Holder, _env
from uprof.backends import sqlite as sqlite_backend

sqlite_only = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)

#: How long the writers and scanners run together (a scan beside the held reader takes
#: the events store's fold bound plus its file reads).
RUN_S = 12.0


@sqlite_only
def test_scans_in_a_loop_lose_and_stall_no_write_of_other_processes(backend: Backend) -> None:
    env = _env(backend)
    data_dir = settings_for(backend).data_dir
    writers = [Holder(env), Holder(env)]
    scanners = [Holder(env), Holder(env)]
    holders = writers + scanners
    try:
        writers[0].ask(op="write", subject="w0", text="I live in Lisbon")  # stores exist
        reader = sqlite3.connect(data_dir / "events.sqlite", isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM stored_events").fetchall()  # a snapshot held
        stop = time.monotonic() + RUN_S
        acked: list[str] = []
        waits: list[float] = []
        scans: list[list[str]] = []
        failures: list[BaseException] = []
        lock = threading.Lock()

        def write(h: Holder, name: str) -> None:
            i = 0
            while time.monotonic() < stop:
                t0 = time.monotonic()
                done = h.ask(op="write", subject=name, text=f"I live in Lisbon number {i}")
                with lock:
                    waits.append(time.monotonic() - t0)
                    acked.append(done["capture_id"])
                i += 1

        def scan(h: Holder) -> None:
            while time.monotonic() < stop:
                report = h.ask(op="scan", terms=["Qzxnotpresent"])
                with lock:
                    scans.append(report["findings"])

        def guarded(fn: Any, *args: Any) -> None:
            try:
                fn(*args)
            except BaseException as error:  # reported below
                failures.append(error)

        threads = [
            threading.Thread(target=guarded, args=(write, writers[0], "w0")),
            threading.Thread(target=guarded, args=(write, writers[1], "w1")),
            threading.Thread(target=guarded, args=(scan, scanners[0])),
            threading.Thread(target=guarded, args=(scan, scanners[1])),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(RUN_S + 120)
        reader.rollback()
        reader.close()
        fresh = Holder(env)
        holders.append(fresh)
        seen = fresh.ask(op="read", subjects=["w0", "w1"], capture_ids=acked)
    finally:
        for h in holders:
            h.close()
    assert failures == []
    assert scans, "no scan finished"
    # Beside the held reader every scan names the events store as unfolded, never clean.
    assert all("events.sqlite" in findings for findings in scans), scans
    assert len(acked) > 20
    assert seen["capture_ids"] == sorted(acked)
    waits.sort()
    print(
        f"writes={len(acked)} scans={len(scans)} write p50={waits[len(waits) // 2]:.3f}s "
        f"max={waits[-1]:.3f}s"
    )
    assert waits[-1] < sqlite_backend.BUSY_TIMEOUT_MS / 1000 / 10  # far from the 30 s


@sqlite_only
def test_a_scan_killed_in_its_fold_loses_no_write(backend: Backend) -> None:
    """The scanning process killed with SIGKILL while its fold retries beside a reader
    (after its file scan: the fold is the scan's last step), a writer writing all along:
    every acknowledged write is seen by a fresh process, and the next scan, once the
    reader is gone, folds every store (clean)."""
    env = _env(backend)
    data_dir = settings_for(backend).data_dir
    writer, scanner = Holder(env), Holder(env)
    holders = [writer, scanner]
    try:
        acked = [writer.ask(op="write", subject="w0", text="I live in Lisbon")["capture_id"]]
        reader = sqlite3.connect(data_dir / "events.sqlite", isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM stored_events").fetchall()
        acked.append(writer.ask(op="write", subject="w0", text="I live in Porto")["capture_id"])
        assert scanner.proc.stdin is not None
        scanner.proc.stdin.write('{"op": "scan", "terms": ["Qzxnotpresent"]}\n')
        scanner.proc.stdin.flush()
        stop = time.monotonic() + 2.0  # inside the events store's fold (2 s of tries)
        i = 0
        while time.monotonic() < stop:
            done = writer.ask(op="write", subject="w0", text=f"I live in Faro {i}")
            acked.append(done["capture_id"])
            i += 1
        scanner.proc.kill()
        scanner.proc.wait(30)
        for j in range(5):
            done = writer.ask(op="write", subject="w1", text=f"I live in Braga {j}")
            acked.append(done["capture_id"])
        reader.rollback()
        reader.close()
        fresh = Holder(env)
        holders.append(fresh)
        seen = fresh.ask(op="read", subjects=["w0", "w1"], capture_ids=acked)
        after = fresh.ask(op="scan", terms=["Qzxnotpresent"])
    finally:
        for h in holders:
            if h.proc.poll() is None:
                h.close()
            else:
                for stream in (h.proc.stdin, h.proc.stdout):
                    if stream is not None:
                        stream.close()
    assert seen["subjects"] == ["w0", "w1"]
    assert seen["capture_ids"] == sorted(acked)
    assert after["findings"] == []
