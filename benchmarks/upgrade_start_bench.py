"""What a start costs with migrations run whole in one transaction (decision
0156-review-of-0149), side by side with another checkout.

``python -m benchmarks.upgrade_start_bench --backend sqlite|postgres --rounds N
[--calls C] [--other TREE]``

Per call, in one process (imports done by a first, untimed start):

- ``start_at_head_ms``: ``open_kernel`` then ``close`` on a store already at head (what
  every CLI command and every server start pays; ``migrate`` returns before alembic);
- ``upgrade_start_ms``: the same after the ``views`` and ``keys`` branches were taken down
  one revision each by alembic's own downgrades (not timed): the start runs the upgrade;
- ``*_cpu_ms``: the same calls' CPU time in this process (steadier than wall time on a
  shared machine; a lock wait shows in wall time only);
- ``first_start_ms`` (SQLite only): the first start on an empty data folder, every
  branch from base.

A checkout from before this benchmark needs this file, side_by_side.py and
schema_downgrade.py (the downgrade it shares with the upgrade tests) in its benchmarks/.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.side_by_side import side_by_side_main


def _timed_ms(fn: Any, cpu: list[float] | None = None) -> float:
    """Wall milliseconds of one call; its CPU milliseconds appended to ``cpu``."""
    began, began_cpu = time.perf_counter(), time.process_time()
    fn()
    if cpu is not None:
        cpu.append((time.process_time() - began_cpu) * 1000)
    return (time.perf_counter() - began) * 1000


def single(backend: str, calls: int, warm: int) -> dict[str, float]:
    from benchmarks.reliability import Target, kernel_on, make_settings, open_kernel, temp_target
    from benchmarks.schema_downgrade import PREVIOUS, downgrade_stores
    from uprof.storage import layout_for

    with temp_target(backend) as target:
        with kernel_on(target):
            pass  # the store is created, imports done
        settings = make_settings(target)

        def start() -> None:
            open_kernel(target).close()

        for _ in range(warm):
            start()
        head_cpu: list[float] = []
        at_head = [_timed_ms(start, head_cpu) for _ in range(calls)]
        upgrades: list[float] = []
        upgrade_cpu: list[float] = []
        for _ in range(calls):
            downgrade_stores(layout_for(settings), PREVIOUS)
            upgrades.append(_timed_ms(start, upgrade_cpu))
        out = {
            "start_at_head_ms": statistics.median(at_head),
            "start_at_head_cpu_ms": statistics.median(head_cpu),
            "upgrade_start_ms": statistics.median(upgrades),
            "upgrade_start_cpu_ms": statistics.median(upgrade_cpu),
        }
    if backend == "sqlite":
        firsts = []
        for _ in range(calls):
            with tempfile.TemporaryDirectory(prefix="uprof-first-") as tmp:
                fresh = Target("sqlite", Path(tmp) / "data")
                firsts.append(_timed_ms(lambda fresh=fresh: open_kernel(fresh).close()))
        out["first_start_ms"] = statistics.median(firsts)
    return out


def main() -> None:
    side_by_side_main("benchmarks.upgrade_start_bench", __doc__, single, calls=10)


if __name__ == "__main__":
    main()
