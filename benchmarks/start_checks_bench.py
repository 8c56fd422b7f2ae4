"""What a start's PostgreSQL checks cost, asked as main asked them (an engine and a
connection of their own each) and as the start asks them now (through the engine its
stores then use: ``uprof.storage.start_engine``, 0249-cli-start-cost).

Run: ``python -m benchmarks.start_checks_bench [--runs 40]``. One database made for the
run on the server of ``UPROF_TEST_POSTGRES_URL`` holding a deployment (``bootstrap``),
dropped after. Each run asks the deployment check (``refuse_without_deployment``) and
the read-only check (``refuse_unwritable_stores``), then takes the first connection the
stores take (the schema lock's); the two ways alternate run by run in this one process,
so the machine's other work disturbs both alike. Prints JSON: per way, every run's wall
and CPU milliseconds (this process's), their medians, the new server sessions per run
(``pg_stat_database.sessions``), and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ADMIN_URL = os.environ.get(
    "UPROF_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def _admin(statement: str) -> list[Any]:
    import sqlalchemy as sa

    engine = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            result = conn.exec_driver_sql(statement)
            return list(result) if result.returns_rows else []
    finally:
        engine.dispose()


def _sessions(database: str) -> int:
    # The server counts a session when it ends; its statistics reach other sessions
    # within a second (PostgreSQL 15's pgstat flush).
    time.sleep(1.1)
    rows = _admin(f"SELECT sessions FROM pg_stat_database WHERE datname = '{database}'")
    return int(rows[0][0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    from uprof.bootstrap import bootstrap
    from uprof.settings import Settings
    from uprof.storage import (
        create_engine,
        refuse_unwritable_stores,
        refuse_without_deployment,
        start_engine,
    )

    database = f"uprof_start_checks_{uuid.uuid4().hex[:8]}"
    _admin(f'CREATE DATABASE "{database}"')
    try:
        with tempfile.TemporaryDirectory() as scratch:
            settings = Settings(
                database_url=f"{ADMIN_URL.rsplit('/', 1)[0]}/{database}",
                key_dir=Path(scratch) / "keys",
                data_dir=Path(scratch) / "data",
                embedder="hashing",
            )
            bootstrap(settings).close()  # a deployment, for the check to find
            url = settings.database_url
            assert url is not None

            def as_main() -> None:
                refuse_without_deployment(settings)
                refuse_unwritable_stores(settings)
                stores = create_engine(url)
                stores.connect().close()
                stores.dispose()

            def now() -> None:
                engine = start_engine(settings)
                assert engine is not None
                refuse_without_deployment(settings, engine)
                refuse_unwritable_stores(settings, engine)
                engine.connect().close()
                engine.dispose()

            ways: dict[str, Callable[[], None]] = {"main": as_main, "now": now}
            samples: dict[str, list[tuple[float, float]]] = {w: [] for w in ways}
            for way in ways.values():
                way()  # warm
            load_before = os.getloadavg()
            for _ in range(args.runs):
                for name, way in ways.items():
                    wall, cpu = time.perf_counter(), time.process_time()
                    way()
                    samples[name].append(
                        ((time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3)
                    )
            sessions: dict[str, int] = {}
            for name, way in ways.items():
                before = _sessions(database)
                way()
                sessions[name] = _sessions(database) - before
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    report: dict[str, Any] = {
        "runs": args.runs,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    for name, runs in samples.items():
        walls = [round(w, 2) for w, _ in runs]
        cpus = [round(c, 2) for _, c in runs]
        report[name] = {
            "wall_ms": walls,
            "cpu_ms": cpus,
            "median_wall_ms": round(statistics.median(walls), 2),
            "median_cpu_ms": round(statistics.median(cpus), 2),
            "server_sessions": sessions[name],
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
