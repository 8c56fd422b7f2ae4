"""What checking the stream-head anchors costs the readers of the whole log (decision
0150-anchor-readers): a rebuild of the views and ``uprof backup``.

``python -m benchmarks.anchor_readers_bench --backend sqlite --rounds 5 --other ../tree``
from a tree's root: runs this file from this tree and from ``--other`` (a checkout
without the check, with this file and ``side_by_side.py`` copied in) alternately, each
round a fresh process on a fresh store of ``--subjects`` subjects (one consent each), and
prints medians of each tree and their ratio. ``--single``: one measurement in this process.

- ``rebuild_ms``: ``Uprof.rebuild`` (the check adds one read of every anchor of the log
  and one read of every stream's head row, before anything is dropped);
- ``backup_ms``: ``uprof backup`` into a fresh folder (the same check, after the copy);
- ``check_ms``: ``ProfilesApplication.damaged_streams`` alone (this tree only).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from benchmarks.side_by_side import side_by_side_main


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


def main() -> None:
    side_by_side_main(
        "benchmarks.anchor_readers_bench",
        __doc__,
        single,
        calls=3,
        sizes={"subjects": 300},
        rounds=3,
    )


if __name__ == "__main__":
    main()
