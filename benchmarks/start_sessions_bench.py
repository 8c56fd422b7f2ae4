"""What one PostgreSQL start costs the server and the process: sessions, wall, CPU.

Run: ``python -m benchmarks.start_sessions_bench [--runs 15] [--baseline TREE]``. One
database made for the run on the server of ``UPROF_TEST_POSTGRES_URL``, holding a
deployment (``bootstrap``), dropped after. Each run is a fresh Python process (the
code of this checkout, or of ``--baseline``, another checkout of uprof, e.g. a worktree
of main) that imports uprof, then times ``bootstrap(settings, deployment="required")``
and its ``close()`` (a CLI command's start on an existing deployment, without the
command): wall and the process's CPU, its own threads' included. The server's count of
sessions on the database (``pg_stat_database.sessions``, read once none is connected)
before and after gives the sessions each start opened. The checkouts alternate run by
run, so the machine's other work disturbs both alike. Prints JSON: per checkout, every
run's figures and their medians, and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ADMIN_URL = os.environ.get(
    "UPROF_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)

#: One start in a process of its own: its wall and CPU milliseconds, as JSON on stdout.
_ONE_START = """
import json, sys, time
from pathlib import Path
from uprof.bootstrap import bootstrap
from uprof.settings import Settings
settings = Settings(database_url=sys.argv[1], key_dir=Path(sys.argv[2]),
                    data_dir=Path(sys.argv[3]), embedder="hashing")
wall, cpu = time.perf_counter(), time.process_time()
bootstrap(settings, deployment="required").close()
print(json.dumps({"wall_ms": (time.perf_counter() - wall) * 1e3,
                  "cpu_ms": (time.process_time() - cpu) * 1e3}))
"""


def _admin(statement: str, params: dict[str, Any] | None = None) -> list[Any]:
    import sqlalchemy as sa

    engine = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            result = conn.execute(sa.text(statement), params or {})
            return list(result) if result.returns_rows else []
    finally:
        engine.dispose()


def _sessions(database: str) -> int:
    """The sessions the server counted on ``database``, once none is connected to it (a
    backend reports its session before it leaves ``pg_stat_activity``)."""
    deadline = time.monotonic() + 30
    while _admin("SELECT count(*) FROM pg_stat_activity WHERE datname = :db", {"db": database})[0][
        0
    ]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"sessions still connected to {database}")
        time.sleep(0.05)
    rows = _admin("SELECT sessions FROM pg_stat_database WHERE datname = :db", {"db": database})
    return int(rows[0][0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--baseline", type=Path, help="another checkout of uprof to compare")
    args = parser.parse_args()
    from uprof.bootstrap import bootstrap
    from uprof.settings import Settings

    here = Path(__file__).resolve().parent.parent
    trees = {"this": here} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    database = f"uprof_start_sessions_{uuid.uuid4().hex[:8]}"
    _admin(f'CREATE DATABASE "{database}"')
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    try:
        with tempfile.TemporaryDirectory() as scratch:
            url = f"{ADMIN_URL.rsplit('/', 1)[0]}/{database}"
            keys, data = Path(scratch) / "keys", Path(scratch) / "data"
            settings = Settings(database_url=url, key_dir=keys, data_dir=data, embedder="hashing")
            bootstrap(settings).close()  # the deployment each start finds
            load_before = os.getloadavg()
            for _ in range(args.runs):
                for name, tree in trees.items():
                    before = _sessions(database)
                    done = subprocess.run(
                        [sys.executable, "-c", _ONE_START, url, str(keys), str(data)],
                        env={**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"},
                        cwd=tree,  # ``-c`` puts the working folder first on the path
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    run = json.loads(done.stdout.strip().splitlines()[-1])
                    run["sessions"] = _sessions(database) - before
                    samples[name].append(run)
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    report: dict[str, Any] = {
        "runs": args.runs,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    for name, runs in samples.items():
        figures: dict[str, Any] = {"tree": trees[name].name}
        for key in ("sessions", "wall_ms", "cpu_ms"):
            values = [round(r[key], 1) for r in runs]
            figures[key] = values
            figures[f"median_{key}"] = statistics.median(values)
        report[name] = figures
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
