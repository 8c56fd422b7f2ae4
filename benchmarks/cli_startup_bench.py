"""How long a fresh CLI process takes: ``uprof --help``, a capture and ``apps list`` on
SQLite, and ``apps list`` on PostgreSQL; wall and CPU seconds.

Run: ``python -m benchmarks.cli_startup_bench [--runs 7] [--baseline PATH] [--no-postgres]``.
Each tree (this checkout, and with ``--baseline`` another checkout, e.g. a ``git
worktree`` of the commit before) runs with this interpreter from its own folder, so the
same installed libraries load in both; each gets its own SQLite data folder with a
consent granted and, unless ``--no-postgres``, its own PostgreSQL database on the server
of ``UPROF_TEST_POSTGRES_URL`` (made for the run by ``apps create``, dropped after).
Runs alternate between the trees command by command, so a machine shared with other work
disturbs both alike. Prints JSON: per tree and command, every run's wall time and the
process's CPU time (user + system), their medians, and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
ADMIN_URL = os.environ.get(
    "UPROF_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)

CAPTURE = [
    "capture",
    "--subject",
    "alice",
    "--app",
    "app:planner",
    "--agent",
    "agent:one",
    "--text",
    "I live in Lisbon and I want to run a half marathon",
]
GRANT = [
    "consent",
    "grant",
    "--subject",
    "alice",
    "--app",
    "app:planner",
    "--category",
    "*",
    "--purpose",
    "personalization",
]


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPROF_")}
    return {**env, "HF_HUB_OFFLINE": "1", **(extra or {})}


def _admin(statement: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


def _run(tree: Path, args: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one fresh process running ``uprof <args>``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "uprof.cli.main", *args],
        cwd=tree,
        env=_env(env),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--baseline", type=Path, help="another checkout to run side by side")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite commands only")
    args = parser.parse_args()
    trees = {"this": HERE}
    if args.baseline is not None:
        trees = {"baseline": args.baseline.resolve(), **trees}
    commands = {
        "help": ["--help"],
        "capture": CAPTURE,
        "apps_list": ["apps", "list"],
    }
    if not args.no_postgres:
        commands["apps_list_postgres"] = ["apps", "list"]
    results: dict[str, dict[str, Any]] = {t: {c: [] for c in commands} for t in trees}
    load_before = os.getloadavg()
    databases: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as scratch:
        data = {name: Path(scratch) / name / "data" for name in trees}
        place: dict[str, dict[str, dict[str, str]]] = {}
        try:
            for name, tree in trees.items():
                place[name] = {}
                _run(tree, ["--data-dir", str(data[name]), *GRANT])
                _run(tree, ["--data-dir", str(data[name]), *CAPTURE])  # warm the file cache
                if not args.no_postgres:
                    databases[name] = f"uprof_cli_start_{uuid.uuid4().hex[:8]}"
                    _admin(f'CREATE DATABASE "{databases[name]}"')
                    place[name]["postgres"] = {
                        "UPROF_EMBEDDER": "hashing",
                        "UPROF_DATABASE_URL": f"{ADMIN_URL.rsplit('/', 1)[0]}/{databases[name]}",
                        "UPROF_KEY_DIR": str(Path(scratch) / name / "pg-keys"),
                    }
                    _run(tree, ["apps", "create", "app:bench"], place[name]["postgres"])
            for _ in range(args.runs):
                for command, argv in commands.items():
                    for name, tree in trees.items():
                        if command == "help":
                            results[name][command].append(_run(tree, argv))
                        elif command == "apps_list_postgres":
                            results[name][command].append(_run(tree, argv, place[name]["postgres"]))
                        else:
                            full = ["--data-dir", str(data[name]), *argv]
                            results[name][command].append(_run(tree, full))
        finally:
            for database in databases.values():
                _admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    report: dict[str, Any] = {
        "runs": args.runs,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "trees": {name: str(tree) for name, tree in trees.items()},
    }
    for name, by_command in results.items():
        for command, samples in by_command.items():
            walls = [round(w, 3) for w, _ in samples]
            cpus = [round(c, 3) for _, c in samples]
            report[f"{name}.{command}"] = {
                "wall_s": walls,
                "cpu_s": cpus,
                "median_wall_s": round(statistics.median(walls), 3),
                "median_cpu_s": round(statistics.median(cpus), 3),
            }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
