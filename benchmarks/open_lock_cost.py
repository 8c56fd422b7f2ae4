"""What holding the stores open costs a process start (the lock ``uprof restore`` checks).

    python -m benchmarks.open_lock_cost [--postgres URL]

Times ``Backend.hold_open`` plus its release (once per process start): a flock on SQLite,
a session advisory lock and its unlock on PostgreSQL, on a warm pool. Prints microseconds
per pair, 3 runs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from uprof.backends import backend_for
from uprof.storage import create_engine


def cost_us(url: str, n: int, runs: int = 3) -> list[float]:
    engine = create_engine(url)
    backend = backend_for(engine)
    try:
        backend.hold_open(engine)()  # warm the pool
        out = []
        for _ in range(runs):
            start = time.perf_counter()
            for _ in range(n):
                backend.hold_open(engine)()
            out.append(round((time.perf_counter() - start) / n * 1e6, 1))
        return out
    finally:
        engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--postgres", default=None, help="a PostgreSQL URL to time as well")
    args = p.parse_args(argv)
    folder = Path(tempfile.mkdtemp())
    print("sqlite us per hold_open+release:", cost_us(f"sqlite:///{folder}/views.sqlite", 2000))
    if args.postgres:
        print("postgres us per hold_open+release:", cost_us(args.postgres, 300))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
