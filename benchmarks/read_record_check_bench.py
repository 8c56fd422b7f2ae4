"""Cost of checking a read's audit entry before the read is served (review of 0138, bug HP).

``check_recordable`` runs once per slice, in the request, on what the read's audit entry
would hold: on main nothing ran there (the entry was checked by the recorder thread, after
the slice was served). Measured alone, in process, for reads of 20, 200 and 1,000 items
(item ids as the kernel makes them). Run from a tree's root: ``python -m
benchmarks.read_record_check_bench``.
"""

from __future__ import annotations

import statistics
import time
import uuid
from datetime import UTC, datetime

from uprof.services.reads import ServedRead, check_recordable

RUNS = 15
READS = 2_000


def _read(items: int) -> ServedRead:
    return ServedRead(
        stream_id=uuid.uuid4(),
        pseudonym="sp_" + uuid.uuid4().hex,
        app_id="app:planner",
        agent_id="app:planner/agent:one",
        purpose="personalization",
        item_ids=tuple(f"m:{uuid.uuid4()}" for _ in range(items)),
        served_at=datetime.now(UTC),
        budget_tokens=2_000,
        n_tokens=1_500,
        principal="app:planner#key:0123456789abcdef",
    )


def main() -> None:
    for items in (20, 200, 1_000):
        read = _read(items)
        runs = []
        for _ in range(RUNS):
            began = time.perf_counter()
            for _ in range(READS):
                check_recordable(read)
            runs.append((time.perf_counter() - began) / READS * 1e6)
        print(f"{items:>5} items: median {statistics.median(runs):7.1f} us per read")


if __name__ == "__main__":
    main()
