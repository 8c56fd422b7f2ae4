"""What reclaiming an expired idempotency key costs (decision
0118-idempotency-reclaim-and-worker-collisions).

``python -m benchmarks.idempotency_reclaim_bench --runs 5 --calls 500`` from the tree's
root (``--postgres URL``: also on PostgreSQL, trust auth; a database of its own is created
and dropped). Run it against two trees (``PYTHONPATH``) to compare their reclaims.

Each call sends one key whose row has expired (the store's clock is moved past the
retention before it, and the per-process purge is held off), so every call takes the
reclaim path: the INSERT refused, the row read, the expired row deleted, the INSERT again,
then the answer stored. Per call, the median over ``--runs`` runs, in ms (wall).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from uprof.backends import backend_for_url
from uprof.services.idempotency import IdempotencyStore, metadata


def _per_call_ms(url: str, calls: int) -> float:
    engine = backend_for_url(url).create_engine(url, fsync_each_commit=False)
    try:
        metadata.create_all(engine)
        now = [1_000_000]
        store = IdempotencyStore(
            engine, b"b" * 32, tenant="bench", retention_s=1.0, clock_ms=lambda: now[0]
        )

        def write(_token: str) -> tuple[dict[str, Any], int]:
            return {"n": now[0]}, 201

        store.run("app:bench", "key", "capture", {"t": 1}, write)
        started = time.perf_counter()
        for _ in range(calls):
            now[0] += 2_000  # past the retention: this call reclaims
            store._last_purge = time.monotonic()  # keep the row for the reclaim path
            outcome = store.run("app:bench", "key", "capture", {"t": 1}, write)
            assert not outcome.replayed
        elapsed = time.perf_counter() - started
        metadata.drop_all(engine)
        return elapsed / calls * 1000
    finally:
        engine.dispose()


def _postgres_database(base: str) -> tuple[str, sa.Engine, str]:
    name = f"uprof_reclaim_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = sa.make_url(base).set(database=name).render_as_string(hide_password=False)
    return url, admin, name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--postgres", default="")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'views.sqlite'}"
        runs = [_per_call_ms(url, args.calls) for _ in range(args.runs)]
        results["sqlite_ms"] = round(statistics.median(runs), 3)
    if args.postgres:
        url, admin, name = _postgres_database(args.postgres)
        try:
            runs = [_per_call_ms(url, args.calls) for _ in range(args.runs)]
            results["postgres_ms"] = round(statistics.median(runs), 3)
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
            admin.dispose()
    results.update(runs=args.runs, calls=args.calls)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
