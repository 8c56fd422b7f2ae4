"""What a keyed withdrawal's turn costs (decision 0159-turn-locks): one lock per key (a
file created and deleted on SQLite; an advisory lock on a connection of a lock engine of
its own on PostgreSQL) against 0158's 256 shared locks (a file kept per shard; a pooled
connection of the views engine).

``python -m benchmarks.turn_lock_bench --backend sqlite --rounds 5 --other ../main``
from a tree's root: runs this file from this tree and from ``--other`` (a checkout of
main, with this file and ``side_by_side.py`` copied in) alternately, each round a fresh
process on a fresh store, and prints medians of each tree and their ratio. ``--single``:
one measurement in this process.

- ``turn_ms``: taking and letting go of the turn of a key not seen before (what a keyed
  ``consent.withdraw`` adds), uncontended;
- ``withdraw_ms``: a keyed withdrawal without erase, as the API runs it
  (``Uprof.idempotent``: claim, turn, withdraw, answer).
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.side_by_side import side_by_side_main

APP = "app:planner"


def _turn_name(store: Any, token: str) -> str:
    name = getattr(store, "turn_name", None)
    if name is not None:
        return str(name(token))
    return f"idempotency-turn-{int(token[:8], 16) % 256}"  # decision 0158's shards


def single(backend: str, calls: int, warm: int) -> dict[str, float]:
    from benchmarks.reliability import kernel_on, temp_target
    from uprof.backends import backend_for

    with temp_target(backend) as target, kernel_on(target) as kernel:
        store = kernel.idempotency
        assert store is not None, "the kernel was built without its idempotency store"
        engine = kernel.views_engine
        lock = backend_for(engine).named_lock

        def turns(tag: str, n: int) -> float:
            started = time.perf_counter()
            for i in range(n):
                with lock(engine, _turn_name(store, store.token(APP, f"{tag}-{i}")), wait_s=10):
                    pass
            return (time.perf_counter() - started) / max(1, n) * 1e3

        turns("warm", warm)
        out = {"turn_ms": turns("bench", calls)}
        consents = [
            kernel.grant_consent(
                f"s{i}", app_id=APP, categories=["*"], purposes=["personalization"]
            )
            for i in range(calls + warm)
        ]

        def withdraw(i: int) -> None:
            def execute(token: str) -> tuple[dict[str, Any], int]:
                kernel.withdraw_consent(f"s{i}", consents[i], request_token=token)
                return {}, 200

            body = {"subject": f"s{i}", "consent_id": consents[i], "erase": False}
            kernel.idempotent(APP, f"w-{i}", "consent.withdraw", body, execute)

        for i in range(warm):
            withdraw(i)
        started = time.perf_counter()
        for i in range(warm, warm + calls):
            withdraw(i)
        out["withdraw_ms"] = (time.perf_counter() - started) / calls * 1e3
        return out


def main() -> None:
    side_by_side_main(
        "benchmarks.turn_lock_bench", __doc__, single, calls=200, sizes={"warm": 20}, rounds=5
    )


if __name__ == "__main__":
    main()
