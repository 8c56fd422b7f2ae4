"""How long a fresh CLI process takes: ``uprof --help`` and a capture, wall and CPU seconds.

Run: ``python -m benchmarks.cli_startup_bench [--runs 7] [--baseline PATH]``. Each tree
(this checkout, and with ``--baseline`` another checkout, e.g. a ``git worktree`` of the
commit before) runs with this interpreter from its own folder, so the same installed
libraries load in both; each gets its own SQLite data folder with a consent granted.
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
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent

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


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPROF_")}
    return {**env, "HF_HUB_OFFLINE": "1"}


def _run(tree: Path, args: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one fresh process running ``uprof <args>``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "uprof.cli.main", *args],
        cwd=tree,
        env=_env(),
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
    args = parser.parse_args()
    trees = {"this": HERE}
    if args.baseline is not None:
        trees = {"baseline": args.baseline.resolve(), **trees}
    commands = {"help": ["--help"], "capture": CAPTURE}
    results: dict[str, dict[str, Any]] = {t: {c: [] for c in commands} for t in trees}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        data = {name: Path(scratch) / name / "data" for name in trees}
        for name, tree in trees.items():
            _run(tree, ["--data-dir", str(data[name]), *GRANT])
            _run(tree, ["--data-dir", str(data[name]), *CAPTURE])  # warm the file cache
        for _ in range(args.runs):
            for command, argv in commands.items():
                for name, tree in trees.items():
                    full = argv if command == "help" else ["--data-dir", str(data[name]), *argv]
                    results[name][command].append(_run(tree, full))
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
