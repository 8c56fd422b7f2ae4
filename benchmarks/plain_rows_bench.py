"""What authenticating plaintext event rows costs: append and load of plaintext rows.

    python -m benchmarks.plain_rows_bench [--events 2000] [--runs 9]

Starts a SQLite deployment in a temporary folder, then per run appends ``--events``
plaintext events (``DamagedEventQuarantined``: ids and times only, the kind of row a
purge signal or a verdict is) to a new stream, mapped by the deployment's mapper and
inserted in one recorder call, and loads them back (rows selected, each mapped back).
Also the mapper alone (no SQL), both ways. Prints the median per run, in microseconds per
event. Run it in a checkout of main and of the branch, side by side (decision
0136-authenticated-plaintext-rows).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from uuid import uuid4

from domain.profile import SubjectProfile
from uprof.bootstrap import bootstrap
from uprof.settings import Settings


def _events(n: int) -> list[SubjectProfile.DamagedEventQuarantined]:
    stream, now = uuid4(), datetime.now(UTC)
    return [
        SubjectProfile.DamagedEventQuarantined(
            originator_id=stream,
            originator_version=v,
            timestamp=now,
            notification_id=v,
            damaged_version=v,
            quarantined_at=now,
        )
        for v in range(1, n + 1)
    ]


def measure(n: int, runs: int) -> dict[str, float]:
    """Median microseconds per event of each step, over ``runs`` runs."""
    with tempfile.TemporaryDirectory() as folder:
        kernel = bootstrap(Settings(data_dir=Path(folder) / "data", embedder="hashing"))
        try:
            app = kernel.app
            mapper, recorder = app.mapper, app.recorder
            out: dict[str, list[float]] = {k: [] for k in ("map", "unmap", "append", "load")}
            for _ in range(runs + 1):  # the first run warms caches and is dropped
                events = _events(n)
                t0 = time.perf_counter()
                stored = [mapper.to_stored_event(e) for e in events]
                t1 = time.perf_counter()
                [mapper.to_domain_event(s) for s in stored]
                t2 = time.perf_counter()
                stored = [mapper.to_stored_event(e) for e in events]
                recorder.insert_events(stored)
                t3 = time.perf_counter()
                loaded = [
                    mapper.to_domain_event(s)
                    for s in recorder.select_events(events[0].originator_id)
                ]
                t4 = time.perf_counter()
                assert len(loaded) == n
                for key, seconds in (
                    ("map", t1 - t0),
                    ("unmap", t2 - t1),
                    ("append", t3 - t2),
                    ("load", t4 - t3),
                ):
                    out[key].append(seconds / n * 1e6)
            return {k: round(statistics.median(v[1:]), 2) for k, v in out.items()}
        finally:
            kernel.close()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--events", type=int, default=2000)
    p.add_argument("--runs", type=int, default=9)
    args = p.parse_args(argv)
    result = measure(args.events, args.runs)
    print(" ".join(f"{k}={v}us/event" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
