"""Two trees measured side by side: the command line of a benchmark that compares this
tree with another checkout (``--other``), one fresh process per round.

A benchmark module using it has a ``single(backend, calls=..., **sizes)`` that measures
once in its process and returns per-call figures (``sizes``: its own integer options, by
default ``warm``), and a ``main`` that hands itself here. Each
round runs ``python -m <module> --single`` in both trees, the first swapping every round,
so load that comes and goes on a shared machine falls on both alike; the output is each
tree's medians and their ratio. A checkout from before the benchmark existed needs the
benchmark file and this one copied into its ``benchmarks/``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]

Single = Callable[..., dict[str, float]]


def _run_in(
    tree: Path, module: str, args: argparse.Namespace, sizes: dict[str, int]
) -> dict[str, float]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            module,
            "--single",
            f"--backend={args.backend}",
            f"--calls={args.calls}",
            *(f"--{name}={getattr(args, name)}" for name in sizes),
        ],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def side_by_side_main(
    module: str,
    description: str | None,
    single: Single,
    *,
    calls: int,
    sizes: dict[str, int] | None = None,
    rounds: int = 5,
) -> None:
    """Parse the command line; with ``--single`` measure once here, else run the rounds
    and print the medians (and, with ``--other``, the ratio this/other of the figures
    both trees report) as JSON. ``sizes``: the benchmark's integer options and their
    defaults (default: ``warm``, 20)."""
    sizes = {"warm": 20} if sizes is None else sizes
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--calls", type=int, default=calls)
    for name, default in sizes.items():
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--other", type=Path, help="the tree to compare with")
    parser.add_argument("--single", action="store_true", help="one measurement, here")
    args = parser.parse_args()
    if args.single:
        chosen = {name: getattr(args, name) for name in sizes}
        print(json.dumps(single(args.backend, calls=args.calls, **chosen)))
        return
    trees = {"this": HERE, **({"other": args.other.resolve()} if args.other else {})}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    order = list(trees.items())
    for _ in range(args.rounds):
        # Alternately, and which tree goes first swaps every round: load that comes and
        # goes, and whatever the first run of a round pays (cold caches), fall on both alike.
        for name, tree in order:
            runs[name].append(_run_in(tree, module, args, sizes))
        order.reverse()
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
