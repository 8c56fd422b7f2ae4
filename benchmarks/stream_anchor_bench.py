"""What the stream-head anchor costs an append and a load (decision
0132-stream-head-anchor).

``python -m benchmarks.stream_anchor_bench --backend sqlite --rounds 5 --other ../tree``
from a tree's root: runs this file from this tree and from ``--other`` (a checkout
without anchors, with this file and ``side_by_side.py`` copied in) alternately, each
round a fresh process on a fresh store, and prints per-call medians of each tree and
their ratio. ``--single``: one measurement in this process (what each round runs).

Per call, on one subject whose stream already holds ``--warm`` events:

- ``append``: ``Uprof.grant_consent`` (load, decide, one event saved, audit entries):
  the anchor adds one key-store transaction after the event commits;
- ``load``: ``ProfilesApplication.load`` of the stream: the anchor adds one key-store
  read and one read of the head row;
- ``slice``: ``Uprof.slice`` of that subject (the hot read path: gate, load, rank, pack,
  the ``SliceServed`` record handed to the recorder thread), review of 0132.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from benchmarks.side_by_side import side_by_side_main


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


def main() -> None:
    side_by_side_main("benchmarks.stream_anchor_bench", __doc__, single, calls=200)


if __name__ == "__main__":
    main()
