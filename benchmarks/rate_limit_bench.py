"""What a rate-limit check costs: the per-process limiter (main until decision
0115-shared-rate-limits) beside the deployment's counters on SQLite and PostgreSQL.

``python -m benchmarks.rate_limit_bench --runs 5 --out docs/bench/rate-limits.json`` from
the tree's root (PostgreSQL at ``--postgres``, trust auth; a database of its own is
created and dropped).

Per check, medians over ``--runs`` runs of ``--calls`` checks under ``30/minute;300/hour``
(the privacy center's default):

- ``allowed``: checks spread over 100 keys, every one allowed and counted (fresh keys
  each run: no run starts over a limit);
- ``refused_memo``: one key over its limit, checked again and again (the limiter
  refuses from memory until the time the database named);
- ``refused_db``: the same, asking the database each time (``RateCounters.hit``: what
  the first refusal in each process costs);
- ``allowed_2proc`` (SQLite and PostgreSQL): two processes checking at once, each its own
  keys, wall time per check of each process (the SQLite write lock is one per file).

``memory`` is the per-process limiter of main (the `limits` library's moving window over
``MemoryStorage``), reproduced here as it was.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from benchmarks.bench_common import run_context
from uprof.services.rate_limits import RateCounters, RateLimiter, bucket_of
from uprof.settings import parse_rate_limit
from uprof.storage import create_engine, migrate

SPEC = "30/minute;300/hour"
KEYS = 100


def _per_call_us(fn: Callable[[str], Any], keys: list[str]) -> tuple[float, float]:
    """Wall and CPU µs per call of ``fn`` over ``keys``."""
    wall, cpu = time.perf_counter(), time.process_time()
    for key in keys:
        fn(key)
    return (
        (time.perf_counter() - wall) / len(keys) * 1e6,
        (time.process_time() - cpu) / len(keys) * 1e6,
    )


def _spread(run: str, calls: int) -> list[str]:
    return [f"{run}-{n % KEYS}" for n in range(calls)]


def _memory_limiter() -> Callable[[str], bool]:
    """main's ``KeyRateLimiter.check``: every limit hit in turn, in process memory."""
    items = parse_rate_limit(SPEC)
    limiter = MovingWindowRateLimiter(MemoryStorage())

    def check(key: str) -> bool:
        for item in items:
            if not limiter.hit(item, key):
                limiter.get_window_stats(item, key)
                return False
        return True

    return check


def _median(runs: list[tuple[float, float]]) -> dict[str, Any]:
    return {
        "wall_us": round(statistics.median(r[0] for r in runs), 1),
        "cpu_us": round(statistics.median(r[1] for r in runs), 1),
        "raw_wall_us": [round(r[0], 1) for r in runs],
    }


def _measure_memory(runs: int, calls: int) -> dict[str, Any]:
    allowed, refused = [], []
    for _ in range(runs):
        check = _memory_limiter()
        run = uuid.uuid4().hex[:8]
        allowed.append(_per_call_us(check, _spread(run, calls)))
        for _ in range(30):
            check("over")
        refused.append(_per_call_us(check, ["over"] * calls))
    return {"allowed": _median(allowed), "refused_memo": _median(refused)}


def _two_processes(url: str, calls: int) -> float:
    """Wall µs per check in each of two processes checking at once (median of the two)."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    procs = [context.Process(target=_child, args=(url, calls, barrier, results)) for _ in range(2)]
    for proc in procs:
        proc.start()
    values = [results.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(60)
    return float(statistics.median(values))


def _child(url: str, calls: int, barrier: Any, results: Any) -> None:
    engine = create_engine(url)
    limiter = RateLimiter(parse_rate_limit(SPEC), RateCounters(engine), "bench")
    run = uuid.uuid4().hex[:8]
    limiter.check(f"{run}-warm")
    barrier.wait(120)
    wall, _ = _per_call_us(limiter.check, _spread(run, calls))
    engine.dispose()
    results.put(wall)


def _measure_db(url: str, runs: int, calls: int) -> dict[str, Any]:
    engine = create_engine(url)
    migrate(engine, "views")
    counters = RateCounters(engine)
    items = parse_rate_limit(SPEC)
    allowed, memo, direct, two = [], [], [], []
    try:
        for _ in range(runs):
            limiter = RateLimiter(items, counters, "bench")
            run = uuid.uuid4().hex[:8]
            limiter.check(f"{run}-warm")  # a pooled connection, the statements compiled
            allowed.append(_per_call_us(limiter.check, _spread(run, calls)))
            over = f"{run}-over"
            for _ in range(30):
                limiter.check(over)
            memo.append(_per_call_us(limiter.check, [over] * calls))
            bucket = bucket_of("bench", over)
            direct.append(_per_call_us(lambda b: counters.hit(b, items), [bucket] * calls))
            two.append(_two_processes(url, calls))
        return {
            "allowed": _median(allowed),
            "refused_memo": _median(memo),
            "refused_db": _median(direct),
            "allowed_2proc_wall_us": round(statistics.median(two), 1),
            "raw_allowed_2proc_wall_us": [round(v, 1) for v in two],
            "rows_after": counters.rows(),
        }
    finally:
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    out: dict[str, Any] = {"spec": SPEC, "keys": KEYS, "calls": args.calls, "runs": args.runs}
    out["context_before"] = run_context()
    out["memory"] = _measure_memory(args.runs, args.calls)
    with tempfile.TemporaryDirectory(prefix="uprof-rl-bench-") as tmp:
        out["sqlite"] = _measure_db(
            f"sqlite:///{Path(tmp) / 'views.sqlite'}", args.runs, args.calls
        )
    name = f"uprof_rl_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(f"{args.postgres}/postgres", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        out["postgres"] = _measure_db(f"{args.postgres}/{name}", args.runs, args.calls)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    out["context_after"] = run_context()
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
