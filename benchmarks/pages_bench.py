"""What pages and the streamed export cost, beside the paths they replace (one process).

``python -m benchmarks.pages_bench --backend sqlite --entries 5000 --runs 5``

Fills an audit log with ``--entries`` served-read entries (one subject), then times,
alternating within each run so machine load hits both alike:

- the console's old audit read (the first 500 entries off the ``entries`` generator)
  against one 100-entry page through the facade (authorization, cursor issue) and the
  page after it (cursor opened, verified, keyset query);
- a walk over every page of the trail (100 per page) against reading it whole;
- the audit export written whole into memory (what ``/v1/audit/export`` answered before)
  against the streamed export consumed record by record: wall time, CPU time and peak
  Python memory (tracemalloc) of each.

Prints JSON with medians; docs/performance.md keeps the figures.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import statistics
import time
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from domain.principal import Principal
from domain.values import Interaction


def _fill(kernel: Any, entries: int) -> None:
    """One subject with a few captures, then ``entries`` served-read audit entries (the
    kind a busy deployment writes most), appended 500 at a time."""
    kernel.grant_consent(
        "alice", app_id="app:planner", categories=["*"], purposes=["personalization"]
    )
    start = datetime(2025, 1, 1, tzinfo=UTC)
    kernel.capture_many(
        "alice",
        [
            Interaction(
                app_id="app:planner",
                agent_id="agent:one",
                occurred_at=start + timedelta(minutes=i),
                user_input=f"note number {i}",
            )
            for i in range(20)
        ],
    )
    pseudonym = kernel.audit_subject_ref("alice")
    reads = [
        (
            "slice.served",
            {
                "subject_ref": pseudonym,
                "app_id": "app:planner",
                "agent_id": "app:planner/agent:one",
                "purpose": "personalization",
                "occurred_at": (start + timedelta(seconds=i)).isoformat(),
                "item_refs": [],
                "counts": {"tokens": 40, "budget": 256},
            },
        )
        for i in range(entries)
    ]
    for offset in range(0, len(reads), 500):
        kernel.audit.record_many(reads[offset : offset + 500])


def _timed(run: Callable[[], Any]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000


def _peak(run: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--entries", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    from benchmarks.reliability import kernel_on, temp_target
    from uprof.facade import Facade

    with temp_target(args.backend) as target, kernel_on(target) as kernel:
        _fill(kernel, args.entries)
        door = Facade(kernel, Principal.local_operator(kernel.subjects.tenant))
        size = kernel.audit_log.size()
        second = door.list_audit_entries(limit=100).next_cursor
        samples: dict[str, list[tuple[float, float]]] = {
            "old_first_500": [],
            "page_first_100": [],
            "page_next_100": [],
            "read_whole_trail": [],
            "walk_every_page": [],
            "export_into_memory": [],
            "export_streamed": [],
        }

        def walk() -> int:
            cursor, seen = None, 0
            while True:
                page = door.list_audit_entries(cursor=cursor, limit=100)
                seen += len(page.items)
                if (cursor := page.next_cursor) is None:
                    return seen

        def export_memory() -> int:
            out = io.StringIO()
            door.export_audit(out)
            return len(out.getvalue())

        def export_streamed() -> int:
            return sum(len(r) for r in door.stream_audit().records)

        runs = {
            # The kernel's unpaged read (the door's unaudited ``audit_entries`` is gone).
            "old_first_500": lambda: list(itertools.islice(kernel.audit_entries(), 500)),
            "page_first_100": lambda: door.list_audit_entries(limit=100),
            "page_next_100": lambda: door.list_audit_entries(cursor=second, limit=100),
            "read_whole_trail": lambda: sum(1 for _ in kernel.audit_entries()),
            "walk_every_page": walk,
            "export_into_memory": export_memory,
            "export_streamed": export_streamed,
        }
        for _ in range(args.runs):
            for name, run in runs.items():
                samples[name].append(_timed(run))
        peaks = {
            "export_into_memory": _peak(export_memory),
            "export_streamed": _peak(export_streamed),
        }
    result = {
        "backend": args.backend,
        "audit_entries": size,
        "runs": args.runs,
        "load_average_1m": round(os.getloadavg()[0], 1),
        "median_ms": {k: round(statistics.median(w for w, _ in v), 1) for k, v in samples.items()},
        "median_cpu_ms": {
            k: round(statistics.median(c for _, c in v), 1) for k, v in samples.items()
        },
        "peak_python_bytes": peaks,
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
