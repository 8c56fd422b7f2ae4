"""A residue scan beside another process's long read answers in seconds (review of 0130,
bug GE; a real reader process; SQLite: PostgreSQL's log is not ours to fold).

Decision 0130 (bug FV) made the scan fold every store itself and report a store it cannot
fold as ``unfolded``, using the erasure's bound: up to 30 s of tries per held store. An
erasure must fold, and waits for it; the scan only reports, and with a backup tool or a
shell holding a read on the three stores one scan took over 90 s (a worker thread of the
server held all along, the console's page waiting past any proxy's timeout), to answer
what a short try already knew. Each scan a compliance key sends beside such a reader
held a worker for as long.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Backend
from tests.kernel.conftest import consent, say, settings_for
from uprof.kernel import Uprof

sqlite_only = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)

_READER = """
import sqlite3, sys
held = []
for path in sys.argv[1:]:
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("BEGIN")
    c.execute("SELECT count(*) FROM sqlite_master").fetchall()
    held.append(c)
print("held", flush=True)
sys.stdin.read()
"""


@sqlite_only
def test_a_scan_beside_a_reader_of_every_store_answers_in_seconds(
    kernel: Uprof, backend: Backend
) -> None:
    consent(kernel)
    kernel.capture("alice", say("I live in Lisbon"))
    kernel.process_once()
    kernel.erase_subject("alice")
    # Frames in every store's log after the erasure's fold (bob's key, event, views),
    # which the reader's snapshot then holds: a reader of an empty log holds no fold up.
    consent(kernel, "bob")
    kernel.capture("bob", say("I live in Oslo"))
    settings = settings_for(backend)
    stores = [
        settings.data_dir / "events.sqlite",
        settings.data_dir / "views.sqlite",
        Path(str(kernel.keys_engine.url.database)),
    ]
    reader = subprocess.Popen(
        [sys.executable, "-c", _READER, *map(str, stores)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        report = kernel.residue_scan(["Qzxnotpresent"])
        took = time.monotonic() - t0
    finally:
        assert reader.stdin is not None
        reader.stdin.close()
        reader.wait(30)
        assert reader.stdout is not None
        reader.stdout.close()
    unfolded = sorted(f.location for f in report.findings if f.kind == "unfolded")
    assert unfolded == sorted(p.name for p in stores), report.findings
    print(f"scan beside a reader of every store: {took:.1f} s")
    assert took < 15, f"the scan took {took:.1f} s beside the reader"
    # With the reader gone the same scan folds every store and is clean.
    assert kernel.residue_scan(["Qzxnotpresent"]).clean
