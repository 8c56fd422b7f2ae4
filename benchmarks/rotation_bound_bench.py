"""What bounding a rotated-out audit key costs (decision 0160-rotation-bound), side by side.

    python -m benchmarks.rotation_bound_bench --rounds 5 --entries 5000 --other ../main

One fresh process per round and tree (``benchmarks.side_by_side``), on a SQLite file log
with a ``FileKeyRing`` key folder (the PostgreSQL log pays the same Python work; its lock
is an advisory lock instead of ``BEGIN IMMEDIATE``). Per process, medians in ms:

- ``rotate_ms``: one key rotation (``calls`` of them). This tree records the log's head
  under its append lock (``AuditLog.held_head``): the lock, the size and the root read; a
  tree without it rotates without the log;
- ``checkpoint_ms``: ``AuditLog.checkpoint()`` after one more entry, no rotation in
  between (this tree checks the signing key's range first, against the cached history);
- ``verify_ms``: ``verify_export`` of an unfiltered ``entries``-entry JSONL trail with the
  key history (one rotation at half the entries: this tree checks the trail passes
  through its point).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa

from audit.export import export_jsonl
from audit.keyring import FileKeyRing
from audit.log import AuditLog
from audit.tables import create_tables
from audit.verify import verify_export
from benchmarks.side_by_side import side_by_side_main
from uprof.backends import backend_for

ORIGIN = "uprof.bench/audit"


def _rotate(ring: FileKeyRing, log: AuditLog) -> None:
    if hasattr(log, "held_head"):
        ring.rotate(log_head=log.held_head)
    else:  # a tree from before the bound
        ring.rotate()


def _fill(log: AuditLog, start: int, count: int) -> None:
    for base in range(start, start + count, 500):
        n = min(500, start + count - base)
        log.append_many({"action": "bench", "request_id": f"r{base + i}"} for i in range(n))


@contextlib.contextmanager
def sqlite_log(backend: str) -> Iterator[tuple[Path, FileKeyRing, AuditLog]]:
    """A SQLite file log with a ``FileKeyRing`` key folder, in a temporary folder (also
    ``benchmarks.retired_below_bench``'s)."""
    if backend != "sqlite":
        raise SystemExit("this benchmark runs on a SQLite file log only")
    with tempfile.TemporaryDirectory() as folder:
        engine = sa.create_engine(f"sqlite:///{Path(folder) / 'audit.sqlite'}")
        create_tables(engine, backend_for(engine))
        ring = FileKeyRing(Path(folder) / "keys")
        try:
            yield Path(folder), ring, AuditLog(engine, ring, ORIGIN, backend=backend_for(engine))
        finally:
            engine.dispose()


def single(backend: str, calls: int, entries: int) -> dict[str, float]:
    with sqlite_log(backend) as (folder, ring, log):
        first = ring.current().public_key()
        _fill(log, 0, entries // 2)
        log.checkpoint()
        _rotate(ring, log)
        _fill(log, entries // 2, entries - entries // 2)
        trail = folder / "trail.jsonl"
        export_jsonl(log, trail)
        history = json.loads(ring.history_path.read_text())
        verify = []
        for _ in range(5):
            start = time.perf_counter()
            verify_export(trail, first, ORIGIN, key_history=history)
            verify.append((time.perf_counter() - start) * 1000)
        checkpoint, rotate = [], []
        for i in range(calls):
            log.append({"action": "bench", "request_id": f"c{i}"})
            start = time.perf_counter()
            log.checkpoint()
            checkpoint.append((time.perf_counter() - start) * 1000)
        for _ in range(calls):
            start = time.perf_counter()
            _rotate(ring, log)
            rotate.append((time.perf_counter() - start) * 1000)
    return {
        "rotate_ms": statistics.median(rotate),
        "checkpoint_ms": statistics.median(checkpoint),
        "verify_ms": statistics.median(verify),
    }


def main() -> None:
    side_by_side_main(
        "benchmarks.rotation_bound_bench",
        __doc__.splitlines()[0],
        single,
        calls=10,
        sizes={"entries": 5000},
    )


if __name__ == "__main__":
    main()
