"""Cost of the event-sourced policy store: decision batches, store checks, changes.

``python -m benchmarks.policy_bench --backend sqlite|postgres [--rounds 2000]``

Side by side in one run, on one deployment:

* ``batch_plain_us``: one slice's decision batch (``decisions_for`` over every catalogue
  category, decision cache warm) on a bare ``CasbinAuthorizer`` built from the seed file
  (the baseline); ``batch_plain_cold_us`` the same with the cache cleared (Casbin's cost);
* ``batch_default_us``: the same batch through the store-backed authorizer with the
  default ``policy_refresh_s`` (a store check at most every 0.25 s);
* ``batch_check_each_us``: the same with ``refresh_s = 0``: a store version check on
  every batch (the worst case of the staleness bound);
* ``grant_ms``: one ``policy_grant`` of one rule (event, audit entry, reload);
* ``reload_ms``: the first batch after another writer changed the store (check + reload);
* ``propagation_*_ms``: wall time from a grant committed in this process to its first
  allowed decision in a second deployment (a spawned process) polling every millisecond.

Medians; the figures go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks.kernel_bench import deployment
from domain.values import CATEGORIES
from policies import CasbinAuthorizer

REQUEST = {
    "app_id": "app:planner",
    "tenant": "default",
    "action": "read",
    "purpose": "personalization",
}


def _median_us(run: Callable[[], Any], rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        began = time.perf_counter()
        run()
        samples.append(time.perf_counter() - began)
    return round(statistics.median(samples) * 1e6, 1)


def measure(backend: str, rounds: int) -> dict[str, Any]:
    with deployment(backend) as k:
        stored = k.authorizer
        plain = CasbinAuthorizer.seeded()

        # Warm decision caches on both sides (what a server sees): the difference is
        # the store-backed wrapper and its version checks, not Casbin.
        def batch_plain() -> None:
            plain.decisions_for(categories=CATEGORIES, **REQUEST)

        def batch_stored() -> None:
            stored.decisions_for(categories=CATEGORIES, **REQUEST)

        def batch_plain_cold() -> None:
            plain.clear_cache()
            plain.decisions_for(categories=CATEGORIES, **REQUEST)

        result: dict[str, Any] = {
            "backend": backend,
            "rounds": rounds,
            "categories_per_batch": len(CATEGORIES),
        }
        result["batch_plain_cold_us"] = _median_us(batch_plain_cold, max(rounds // 10, 20))
        result["batch_plain_us"] = _median_us(batch_plain, rounds)
        result["batch_default_us"] = _median_us(batch_stored, rounds)
        stored.refresh_s = 0.0
        result["batch_check_each_us"] = _median_us(batch_stored, rounds)

        grants, reloads = [], []
        for i in range(40):
            purpose = f"bench-{i}"
            began = time.perf_counter()
            k.policy_grant(
                requested_by="operator:local#bench",
                app_id="app:planner",
                actions=["read"],
                categories=["diet"],
                purpose=purpose,
            )
            grants.append(time.perf_counter() - began)
            # Another writer: a change the authorizer has not loaded yet.
            k.policy.app.save(_external_change(k, i))
            began = time.perf_counter()
            stored.decisions_for(categories=CATEGORIES, **REQUEST)
            reloads.append(time.perf_counter() - began)
        result["grant_ms"] = round(statistics.median(grants) * 1e3, 2)
        result["reload_ms"] = round(statistics.median(reloads) * 1e3, 2)
        result["policy_version"] = stored.policy_version
    return result


def _watch(settings_json: str, purposes: list[str], ready: Any, results: Any) -> None:
    """In a second deployment: note when each purpose's grant becomes visible here."""
    from uprof.bootstrap import bootstrap
    from uprof.settings import Settings

    k = bootstrap(Settings.model_validate_json(settings_json))
    try:
        ready.set()
        for purpose in purposes:
            while not k.authorizer.is_allowed(
                app_id="app:planner",
                tenant="default",
                action="read",
                category="goal",
                purpose=purpose,
            ):
                time.sleep(0.001)
            results.put(time.time())
    finally:
        k.close()


def measure_propagation(backend: str, runs: int) -> dict[str, Any]:
    """Wall time from a grant's commit in one process to its first use in another."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    purposes = [f"spread-{i}" for i in range(runs)]
    with deployment(backend) as k:
        ready, results = context.Event(), context.Queue()
        watcher = context.Process(
            target=_watch, args=(k.settings.model_dump_json(), purposes, ready, results)
        )
        watcher.start()
        ready.wait(120)
        delays = []
        for purpose in purposes:
            time.sleep(0.3)  # let the watcher settle into its poll between runs
            k.policy_grant(
                requested_by="operator:local#bench",
                app_id="app:planner",
                actions=["read"],
                categories=["goal"],
                purpose=purpose,
            )
            committed = time.time()
            delays.append(results.get(timeout=60) - committed)
        watcher.join(60)
    return {
        "propagation_runs": runs,
        "refresh_s": k.settings.policy_refresh_s,
        "propagation_p50_ms": round(statistics.median(delays) * 1e3, 1),
        "propagation_max_ms": round(max(delays) * 1e3, 1),
    }


def _external_change(k: Any, i: int) -> Any:
    policy = k.policy_service._load()
    policy.add_rule(
        ["app:planner", "default", "read", "goal", f"other-{i}", "allow"], "operator:local#bench"
    )
    return policy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="sqlite", choices=["sqlite", "postgres"])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--propagation-runs", type=int, default=10)
    args = parser.parse_args()
    result = measure(args.backend, args.rounds)
    result.update(measure_propagation(args.backend, args.propagation_runs))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
