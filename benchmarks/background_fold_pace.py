"""How the background fold (bugs CU, DT, DU) fares beside steady writers.

    python -m benchmarks.background_fold_pace [--writers 2] [--seconds 20] [--runs 3]

A store file in WAL mode (``uprof.storage.create_engine``, as uprof opens it) takes a
small commit and a read from each writer process every ``--gap-ms``. Folder processes
do what ``recovery._fold_when_free`` does for an owed store: wait ``REFOLD_PAUSE_S``,
then one ``fold_log(engine, timeout_s=0)`` (one try of at most ``FOLD_TRY_MS``).

1. *Pace*: from a WAL with rows in it, how long until a folder's first fold succeeds,
   and after how many tries (each folder process, per run).
2. *Harm*: with 0, 1 and 2 folder processes trying once a second for ``--seconds``
   (each going on after a success, as if a fold were owed again), the writers' commit
   latency (p50, p99, max in ms) and how many commits failed ("database is locked",
   5 s busy timeout as in the CT test).

Real processes throughout; prints one line per measurement. No assertion: this is a
measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path

WRITER_BUSY_MS = 5_000


def _writer(path: str, gap_s: float, until: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    import sqlite3

    conn = sqlite3.connect(path, isolation_level=None, timeout=WRITER_BUSY_MS / 1000)
    latencies: list[float] = []
    failed = 0
    while time.time() < until:
        start = time.perf_counter()
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (v) VALUES (randomblob(200))")
            conn.execute("COMMIT")
            latencies.append((time.perf_counter() - start) * 1000)
        except sqlite3.OperationalError:
            failed += 1
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        conn.execute("SELECT count(*) FROM t WHERE id > (SELECT max(id) - 10 FROM t)").fetchone()
        time.sleep(gap_s)
    conn.close()
    out.put({"latencies": latencies, "failed": failed})


def _folder(path: str, until: float, keep_going: bool, out: mp.Queue) -> None:  # type: ignore[type-arg]
    from uprof.services.recovery import REFOLD_PAUSE_S
    from uprof.storage import create_engine, fold_log

    engine = create_engine(f"sqlite:///{path}")
    began = time.perf_counter()
    tries = successes = 0
    first: float | None = None
    first_tries: int | None = None
    try:
        while time.time() < until:
            time.sleep(REFOLD_PAUSE_S)
            tries += 1
            if fold_log(engine, timeout_s=0):
                successes += 1
                if first is None:
                    first = time.perf_counter() - began
                    first_tries = tries
                if not keep_going:
                    break
    finally:
        engine.dispose()
    out.put(
        {
            "first_s": first,
            "first_tries": first_tries,
            "tries": tries,
            "successes": successes,
        }
    )


def _prepare(path: Path) -> None:
    from uprof.storage import create_engine

    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v BLOB)")
        conn.exec_driver_sql(
            "INSERT INTO t (v) SELECT randomblob(200) FROM "
            "(WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 2000) "
            "SELECT x FROM c)"
        )
    engine.dispose()


def _round(
    path: Path, writers: int, folders: int, seconds: float, gap_s: float, keep_going: bool
) -> tuple[list[dict], list[dict]]:  # type: ignore[type-arg]
    ctx = mp.get_context("spawn")
    out_w: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    out_f: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    until = time.time() + seconds
    procs = [
        ctx.Process(target=_writer, args=(str(path), gap_s, until, out_w)) for _ in range(writers)
    ]
    procs += [
        ctx.Process(target=_folder, args=(str(path), until, keep_going, out_f))
        for _ in range(folders)
    ]
    for p in procs:
        p.start()
    w = [out_w.get() for _ in range(writers)]
    f = [out_f.get() for _ in range(folders)]
    for p in procs:
        p.join()
    return w, f


def _ms(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--gap-ms", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    gap_s = args.gap_ms / 1000
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            for folders in (1, 2):
                path = Path(tmp) / f"pace-{run}-{folders}.sqlite"
                _prepare(path)
                _, f = _round(path, args.writers, folders, args.seconds, gap_s, False)
                print(json.dumps({"pace": {"run": run, "folders": folders, "each": f}}))
        for folders in (0, 1, 2):
            path = Path(tmp) / f"harm-{folders}.sqlite"
            _prepare(path)
            w, f = _round(path, args.writers, folders, args.seconds, gap_s, True)
            lat = [x for r in w for x in r["latencies"]]
            print(
                json.dumps(
                    {
                        "harm": {
                            "folders": folders,
                            "commits": len(lat),
                            "failed": sum(r["failed"] for r in w),
                            "p50_ms": round(_ms(lat, 50), 2),
                            "p99_ms": round(_ms(lat, 99), 2),
                            "max_ms": round(max(lat), 2) if lat else None,
                            "fold_successes": [r["successes"] for r in f],
                            "fold_tries": [r["tries"] for r in f],
                        }
                    }
                )
            )


if __name__ == "__main__":
    main()
