"""What the stream-head anchor costs an append and a load (decision 0132-stream-head-anchor).

``python -m benchmarks.stream_anchor_bench --backend sqlite --rounds 5 --other ../tree``
from a tree's root: runs this file from this tree and from ``--other`` (a checkout
without anchors, with this file copied in) alternately, each round a fresh process on a
fresh store, and prints per-call medians of each tree and their ratio. ``--single``: one
measurement in this process (what each round runs).

Per call, on one subject whose stream already holds ``--warm`` events:

- ``append``: ``Uprof.grant_consent`` (load, decide, one event saved, audit entries):
  the anchor adds one key-store transaction after the event commits;
- ``load``: ``ProfilesApplication.load`` of the stream: the anchor adds one key-store
  read and one read of the head row;
- ``slice``: ``Uprof.slice`` of that subject (the hot read path: gate, load, rank, pack,
  the ``SliceServed`` record handed to the recorder thread), review of 0132.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]


def _per_call_ms(fn: Callable[[], Any], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls * 1e3


def single(backend: str, calls: int, warm: int) -> dict[str, float]:
    from benchmarks.reliability import kernel_on, temp_target

    with temp_target(backend) as target, kernel_on(target) as kernel:

        def grant() -> Any:
            return kernel.grant_consent(
                "alice", app_id="app:planner", categories=["*"], purposes=["personalization"]
            )

        for _ in range(warm):
            grant()
        stream = kernel.stream_of("alice")
        kernel.app.load(stream)

        def slice_() -> Any:
            return kernel.slice(
                "alice",
                "what does alice like",
                budget_tokens=200,
                purpose="personalization",
                app_id="app:planner",
                agent_id="coach",
            )

        slice_()
        return {
            "append_ms": _per_call_ms(grant, calls),
            "load_ms": _per_call_ms(lambda: kernel.app.load(stream), calls),
            "slice_ms": _per_call_ms(slice_, calls),
        }


def _run_in(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.stream_anchor_bench",
            "--single",
            f"--backend={args.backend}",
            f"--calls={args.calls}",
            f"--warm={args.warm}",
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
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warm", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--other", type=Path, help="the tree to compare with")
    parser.add_argument("--single", action="store_true")
    args = parser.parse_args()
    if args.single:
        print(json.dumps(single(args.backend, args.calls, args.warm)))
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
            k: round(medians["this"][k] / medians["other"][k], 3) for k in medians["this"]
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
