"""What one CLI command costs after the imports, on both backends: the path every
CLI-driven test and every operator's command pays (settings, the deployment check,
the start, the command, the close).

Run: ``python -m benchmarks.cli_command_bench [--runs 15] [--rounds 3] [--baseline PATH]``.
Each tree (this checkout, and with ``--baseline`` another checkout, e.g. a ``git
worktree`` of main) runs in a process of its own with this interpreter, from its own
folder; the trees alternate round by round, so a machine shared with other work disturbs
both alike. In each process a deployment is made (``apps create``: a command every tree
has) in a new data folder (SQLite) or a new database (PostgreSQL, on the server of
``UPROF_TEST_POSTGRES_URL``, dropped after), then each command is run ``--runs`` times
in process (typer's ``CliRunner``, the command tree built once, as the tests do).
Prints JSON: per tree, backend and command, each round's median wall seconds, and the
load average before and after.
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

HERE = Path(__file__).resolve().parent.parent
ADMIN_URL = os.environ.get(
    "UPROF_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
COMMANDS = (("apps", "list"), ("policy", "show"), ("projections", "lag"))


def _admin(statement: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


def measure(backend: str, runs: int) -> dict[str, float]:
    """In this process: the median wall seconds of each of ``COMMANDS``."""
    import functools

    import typer
    from typer.testing import CliRunner

    from uprof.cli.main import app

    typer.testing._get_command = functools.cache(typer.main.get_command)  # type: ignore[attr-defined]
    folder = Path(tempfile.mkdtemp(prefix="uprof-cli-bench-"))
    env = {
        "UPROF_DATA_DIR": str(folder / "data"),
        "UPROF_KEY_DIR": str(folder / "keys"),
        "UPROF_EMBEDDER": "hashing",
    }
    database = None
    if backend == "postgres":
        database = f"uprof_cli_bench_{uuid.uuid4().hex[:8]}"
        _admin(f'CREATE DATABASE "{database}"')
        env["UPROF_DATABASE_URL"] = f"{ADMIN_URL.rsplit('/', 1)[0]}/{database}"
    runner = CliRunner()
    try:
        made = runner.invoke(app, ["apps", "create", "app:bench"], env=env)
        if made.exit_code != 0:
            raise RuntimeError(f"apps create: {made.output}")
        medians: dict[str, float] = {}
        for command in COMMANDS:
            walls = []
            for _ in range(runs):
                began = time.perf_counter()
                done = runner.invoke(app, list(command), env=env)
                walls.append(time.perf_counter() - began)
                if done.exit_code != 0:
                    raise RuntimeError(f"{' '.join(command)}: {done.output}")
            medians[" ".join(command)] = statistics.median(walls)
        return medians
    finally:
        if database is not None:
            _admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def _in_tree(tree: Path, backend: str, runs: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPROF_")}
    env |= {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(tree)}
    if "UPROF_TEST_POSTGRES_URL" in os.environ:
        env["UPROF_TEST_POSTGRES_URL"] = os.environ["UPROF_TEST_POSTGRES_URL"]
    # This file run in the tree's folder, its imports the tree's (a baseline may not
    # hold this benchmark).
    script = (
        "import runpy, sys\n"
        f"sys.argv = [{__file__!r}, '--one', {backend!r}, '{runs}']\n"
        f"runpy.run_path({__file__!r}, run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another checkout to run side by side")
    parser.add_argument("--one", nargs=2, metavar=("BACKEND", "RUNS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]))))
        return
    trees = {"this": HERE}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    out: dict[str, Any] = {"load_before": os.getloadavg()[0], "rounds": []}
    for _ in range(args.rounds):
        round_: dict[str, Any] = {}
        for name, tree in trees.items():
            for backend in ("sqlite", "postgres"):
                round_[f"{name} {backend}"] = _in_tree(tree, backend, args.runs)
        out["rounds"].append(round_)
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
