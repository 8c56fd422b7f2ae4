"""What checking the stream-head anchors costs the readers of the whole log (decision
0150-anchor-readers): a rebuild of the views and ``uprof backup``.

``python -m benchmarks.anchor_readers_bench --backend sqlite --rounds 5 --other ../tree``
from a tree's root: runs this file from this tree and from ``--other`` (a checkout
without the check, with this file copied in) alternately, each round a fresh process on
a fresh store of ``--subjects`` subjects (one consent each), and prints medians of each
tree and their ratio. ``--single``: one measurement in this process.

- ``rebuild_ms``: ``Uprof.rebuild`` (the check adds one read of every anchor of the log
  and one read of every stream's head row, before anything is dropped);
- ``backup_ms``: ``uprof backup`` into a fresh folder (the same check, after the copy);
- ``check_ms``: ``ProfilesApplication.damaged_streams`` alone (this tree only).
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
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]


def single(backend: str, subjects: int, calls: int) -> dict[str, float]:
    from benchmarks.reliability import kernel_on, temp_target
    from uprof.services.backup import backup

    with temp_target(backend) as target, kernel_on(target) as kernel:
        for i in range(subjects):
            kernel.grant_consent(
                f"s{i}", app_id="app:planner", categories=["*"], purposes=["personalization"]
            )
        kernel.process()
        out: dict[str, float] = {}
        started = time.perf_counter()
        for _ in range(calls):
            kernel.rebuild()
        out["rebuild_ms"] = (time.perf_counter() - started) / calls * 1e3
        with tempfile.TemporaryDirectory(prefix="uprof-bk-") as tmp:
            started = time.perf_counter()
            for i in range(calls):
                backup(kernel.settings, Path(tmp) / f"bk{i}")
            out["backup_ms"] = (time.perf_counter() - started) / calls * 1e3
        check = getattr(kernel.app, "damaged_streams", None)
        if check is not None:
            started = time.perf_counter()
            for _ in range(calls):
                assert check() == []
            out["check_ms"] = (time.perf_counter() - started) / calls * 1e3
        return out


def _run_in(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.anchor_readers_bench",
            "--single",
            f"--backend={args.backend}",
            f"--subjects={args.subjects}",
            f"--calls={args.calls}",
        ],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--subjects", type=int, default=300)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--other", type=Path, help="the tree to compare with")
    parser.add_argument("--single", action="store_true")
    args = parser.parse_args()
    if args.single:
        print(json.dumps(single(args.backend, args.subjects, args.calls)))
        return
    trees = {"this": HERE, **({"other": args.other.resolve()} if args.other else {})}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():  # alternately: drift hits both alike
            runs[name].append(_run_in(tree, args))
    medians = {
        name: {k: round(statistics.median(r[k] for r in rs), 3) for k in rs[0]}
        for name, rs in runs.items()
    }
    out: dict[str, Any] = {"backend": args.backend, "rounds": args.rounds, "median": medians}
    if "other" in medians:
        out["ratio_this_to_other"] = {
            k: round(medians["this"][k] / medians["other"][k], 3)
            for k in medians["this"]
            if k in medians["other"]
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
