"""What sealing the policy store costs a policy check, a reload and a change
(decision 0140-sealed-policy-store).

``python -m benchmarks.policy_seal_bench --backend sqlite --rounds 5 --other ../tree``
from a tree's root: runs this file from this tree and from ``--other`` (a checkout
without the seal, with this file copied in) alternately, each round a fresh process on a
fresh store, and prints per-call medians of each tree and their ratio. ``--single``: one
measurement in this process (what each round runs).

Per call, on the default tenant's policy (seeded, plus ``--warm`` changes):

- ``check_us``: one decision with a store check on every call (``refresh_s = 0``: the
  worst case of the staleness bound; the default checks at most every 0.25 s). The seal
  adds nothing here: the check compares the store's highest notification id;
- ``reload_ms``: ``PolicyService.current_rows()``, the load a process does when another
  changed the policy: the seal adds one key-store read (the anchor), one read of the
  anchored row, and one HMAC per row read;
- ``change_ms``: one ``policy_grant`` or ``policy_revoke`` of one rule (load, event
  saved, audit entry, reload): the seal adds the load's checks, one HMAC on write, and
  the anchor's raise after the commit (one key-store read, one row read, one write).
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


def _per_call(fn: Callable[[], Any], calls: int, scale: float) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls * scale


def single(backend: str, calls: int, warm: int) -> dict[str, float]:
    from benchmarks.reliability import kernel_on, temp_target
    from domain.principal import Principal
    from uprof.facade import Facade

    with temp_target(backend) as target, kernel_on(target) as kernel:
        facade = Facade(kernel, Principal.local_operator(kernel.subjects.tenant))
        rule = {
            "role": "role:assistant",
            "actions": ["read"],
            "categories": ["health"],
            "purpose": "personalization",
        }
        turn = [0]

        def change() -> Any:
            turn[0] += 1
            return (facade.policy_grant if turn[0] % 2 else facade.policy_revoke)(**rule)

        for _ in range(warm):
            change()
        authorizer = kernel.policy.authorizer
        authorizer.refresh_s = 0.0
        tenant = kernel.subjects.tenant

        def check() -> Any:
            return authorizer.decide(
                app_id="app:planner",
                tenant=tenant,
                action="read",
                category="diet",
                purpose="personalization",
            )

        check()
        return {
            "check_us": _per_call(check, calls * 10, 1e6),
            "reload_ms": _per_call(kernel.policy.current_rows, calls, 1e3),
            "change_ms": _per_call(change, calls, 1e3),
        }


def _run_in(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.policy_seal_bench",
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
    parser.add_argument("--calls", type=int, default=100)
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
