"""What the residue scan's child process costs, against the old in-process raw read.

``python -m benchmarks.residue_bench [--subjects 3] [--events 5000] [--runs 5]``

A SQLite deployment gets ``subjects`` x ``events`` captures (plus extraction results);
then, with the deployment closed (no connection in this process, so the baseline's
plain reads are harmless here), both scans run over the same data folder, alternating,
``runs`` times each:

* ``child``: ``residue.scan_files``: a child process, per database a read-only snapshot,
  raw bytes of the file and its siblings, then every table through the snapshot;
* ``baseline``: the old code, this process reading every file with plain reads (the
  read that dropped a live server's locks), raw bytes only.

A third figure, ``child_live``, times the child while the deployment is open, the way
a server runs it. Medians in seconds; the JSON goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.kernel_bench import capture_batched, deployment, grant
from uprof.services.residue import ResidueReport, scan_files
from uprof.services.residue_files import CHUNK, needles

TERMS = ["Porto", "Miso", "cello", "renovation"]


def baseline_scan(root: Path, terms: list[str]) -> int:
    """The pre-0010 scan: plain reads in this process. Only for a folder nobody has open."""
    wanted = [n for term in terms for n in needles(term)]
    overlap = max(len(n) for n in wanted)
    hits = 0
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        with path.open("rb") as fh:
            tail = b""
            while chunk := fh.read(CHUNK):
                window = tail + chunk
                hits += sum(1 for n in wanted if n in window)
                tail = window[-overlap:]
    return hits


def _timed(fn: Any) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def measure(subjects: int, events: int, runs: int) -> dict[str, Any]:
    live: list[float] = []
    with deployment("sqlite") as k:
        for i in range(subjects):
            grant(k, f"person-{i}")
            capture_batched(k, f"person-{i}", events, 1_000, offset=i * 10_000_000)
        k.process()
        data_dir = k.settings.data_dir
        for _ in range(runs):
            live.append(_timed(lambda: scan_files(data_dir, TERMS, ResidueReport())))
        k.close()
        child: list[float] = []
        baseline: list[float] = []
        report = ResidueReport()
        for _ in range(runs):
            child.append(_timed(lambda: scan_files(data_dir, TERMS, report)))
            baseline.append(_timed(lambda: baseline_scan(data_dir, TERMS)))
        size = sum(p.stat().st_size for p in data_dir.rglob("*") if p.is_file())
    return {
        "backend": "sqlite",
        "captures": subjects * events,
        "data_bytes": size,
        "runs": runs,
        "child_p50_s": round(statistics.median(child), 3),
        "baseline_p50_s": round(statistics.median(baseline), 3),
        "child_live_p50_s": round(statistics.median(live), 3),
        "tables_scanned": report.tables_scanned // runs,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--subjects", type=int, default=3)
    p.add_argument("--events", type=int, default=5_000)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    print(json.dumps(measure(args.subjects, args.events, args.runs), indent=2))


if __name__ == "__main__":
    main()
