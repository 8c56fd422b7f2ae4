"""How long a start waits for the schema lock beside a process that rebuilds the views in
a loop, and how many turns at the lock it takes (0256-start-lock-turns).

    python -m benchmarks.start_beside_rebuild_bench sqlite|postgres [--starts 10]
        [--seed 300] [--rounds 2] [--tree PATH ...] [--out FILE]

A fresh store (SQLite folder or PostgreSQL database) gets ``--seed`` captures of one
subject and one erased item (so the erasure ledger names an item, and every start
catches the views up under the views' lock before it reads them, as
``tests/kernel/test_start_beside_a_rebuild.py`` sets up). Then, for each ``--tree`` (a
checkout of uprof: its code runs the children; default: this one) in turn, ``--rounds``
times: a child rebuilds the views again and again (``Uprof.rebuild``), and ``--starts``
children, one after another, each run ``bootstrap`` as a CLI command does
(``deployment="required"``) and close. Each start child times its ``bootstrap`` and every
schema-lock take inside it (the backend's ``schema_lock``: time to the grant, time held,
the purpose). Prints one JSON object: per tree, the starts' wall times, turns per start
and waits, with medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from benchmarks.reliability import Target, grant_all, interaction, kernel_on, temp_target

SUBJECT = "lock-turns-bench"

#: The settings every child builds (the rules extractor, the hashing embedder).
_SETTINGS = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from uprof.settings import Settings

    data_dir, url = Path(sys.argv[1]), (sys.argv[2] or None)
    settings = Settings(data_dir=data_dir, database_url=url, embedder="hashing",
                        extractor="rules", background_workers=False)
    """
)

#: Rebuilds until the stop file exists; writes the rounds done after each.
_REBUILDER = _SETTINGS + textwrap.dedent(
    """
    from uprof.bootstrap import bootstrap

    rounds, stop, ready = Path(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5])
    kernel = bootstrap(settings)
    try:
        ready.touch()
        n = 0
        while not stop.exists():
            kernel.rebuild()
            n += 1
            rounds.write_text(str(n))
    finally:
        kernel.close()
    """
)

#: One start, timed; every schema-lock take in it recorded (wait to the grant, hold).
_START = _SETTINGS + textwrap.dedent(
    """
    import contextlib
    from uprof.backends.postgres import PostgresBackend
    from uprof.backends.sqlite import SQLiteBackend
    from uprof.bootstrap import bootstrap

    turns = []

    def timed(original):
        @contextlib.contextmanager
        def schema_lock(self, engine, *, wait_s, purpose):
            asked = time.perf_counter()
            with original(self, engine, wait_s=wait_s, purpose=purpose):
                granted = time.perf_counter()
                try:
                    yield
                finally:
                    turns.append({"purpose": purpose, "store": engine.url.database,
                                  "wait_s": granted - asked,
                                  "held_s": time.perf_counter() - granted})
        return schema_lock

    for backend in (PostgresBackend, SQLiteBackend):
        backend.schema_lock = timed(backend.schema_lock)
    started = time.perf_counter()
    kernel = bootstrap(settings, deployment="required")
    took = time.perf_counter() - started
    kernel.close()
    print(json.dumps({"start_s": took, "turns": turns}))
    """
)


def _seed(target: Target, seed: int) -> None:
    with kernel_on(target) as kernel:
        grant_all(kernel, SUBJECT)
        for n in range(seed):
            kernel.capture(SUBJECT, interaction(f"I want to try seed marker {n}"))
        kernel.process()
        item = kernel.profile(SUBJECT).intents[0].item_id
        kernel.erase_item(SUBJECT, item)  # the ledger names an item from now on
        kernel.process()


def _child_env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}


def _args(target: Target) -> list[str]:
    return [str(target.data_dir), target.database_url or ""]


def one_round(target: Target, tree: Path, starts: int, scratch: Path) -> dict[str, Any]:
    """``starts`` starts beside a looping rebuild, on ``tree``'s code."""
    scratch.mkdir(parents=True)
    rounds, stop, ready = scratch / "rounds", scratch / "stop", scratch / "ready"
    rebuilder = subprocess.Popen(
        [sys.executable, "-c", _REBUILDER, *_args(target), str(rounds), str(stop), str(ready)],
        env=_child_env(tree),
        cwd=tree,  # ``-c`` puts the working folder first on the path
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    results: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 300
        while not rounds.exists():  # one round done: the loop is under way
            if rebuilder.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the rebuilder never rebuilt: {rebuilder.communicate()[1]}")
            time.sleep(0.05)
        for _ in range(starts):
            wall = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-c", _START, *_args(target)],
                env=_child_env(tree),
                cwd=tree,
                capture_output=True,
                text=True,
                timeout=600,
            )
            wall = time.perf_counter() - wall
            if done.returncode != 0:
                raise SystemExit(f"a start failed: {done.stderr[-3000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            result["wall_s"] = wall
            results.append(result)
    finally:
        stop.touch()
        _, err = rebuilder.communicate(timeout=600)
    if rebuilder.returncode != 0:
        raise SystemExit(f"the rebuilder failed: {err[-3000:]}")
    return {
        "rebuild_rounds": int(rounds.read_text()),
        "starts": results,
    }


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3) if values else 0.0


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    starts = [s for run in runs for s in run["starts"]]
    waits = [sum(t["wait_s"] for t in s["turns"]) for s in starts]
    return {
        "starts": len(starts),
        "median_start_s": _median([s["start_s"] for s in starts]),
        "median_wall_s": _median([s["wall_s"] for s in starts]),
        "median_lock_wait_s": _median(waits),
        "median_turns": _median([float(len(s["turns"])) for s in starts]),
        "turn_purposes": sorted({t["purpose"] for s in starts for t in s["turns"]}),
        "median_wait_by_purpose_s": {
            purpose: _median(
                [t["wait_s"] for s in starts for t in s["turns"] if t["purpose"] == purpose]
            )
            for purpose in sorted({t["purpose"] for s in starts for t in s["turns"]})
        },
        "rebuild_rounds": [run["rebuild_rounds"] for run in runs],
        "per_round_median_start_s": [
            _median([s["start_s"] for s in run["starts"]]) for run in runs
        ],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=["sqlite", "postgres"])
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--seed", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--tree",
        action="append",
        type=Path,
        help="a checkout whose code the children run (repeat: alternated); default: this one",
    )
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    trees = args.tree or [Path(__file__).resolve().parent.parent]
    runs: dict[str, list[dict[str, Any]]] = {str(tree): [] for tree in trees}
    with temp_target(args.kind) as target, tempfile.TemporaryDirectory() as scratch:
        _seed(target, args.seed)
        for r in range(args.rounds):
            for i, tree in enumerate(trees):
                place = Path(scratch) / f"r{r}-t{i}"
                runs[str(tree)].append(one_round(target, tree, args.starts, place))
    out = {
        "kind": args.kind,
        "starts_per_round": args.starts,
        "seed": args.seed,
        "load_average": os.getloadavg(),
        "trees": {tree: {"summary": summary(r), "runs": r} for tree, r in runs.items()},
    }
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(json.dumps({tree: v["summary"] for tree, v in out["trees"].items()}, indent=1))


if __name__ == "__main__":
    main()
