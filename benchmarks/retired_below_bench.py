"""What a retired key's rotation proof costs an export's verifier, side by side.

Decision 0175-retired-below.

    python -m benchmarks.retired_below_bench --rounds 5 --entries 2000 --other ../main

One fresh process per round and tree (``benchmarks.side_by_side``), on a SQLite file log
with a ``FileKeyRing`` key folder. An unfiltered JSONL trail of ``entries`` entries is
exported, the log grows by a tenth, the key is rotated out, and the log grows again; then
``verify_export`` with the key history, medians in ms:

- ``verify_old_ms``: the trail exported before the rotation. This tree checks the
  rotation proof from its size to the point beside it (a tree without the parameter
  verifies it on the retired key's word, as it did);
- ``verify_new_ms``: a trail of the whole log exported after the rotation (the new key's:
  no proof needed in either tree; it passes through the point).
"""

from __future__ import annotations

import base64
import inspect
import json
import statistics
import time
from typing import Any

from audit.export import export_jsonl
from audit.verify import verify_export
from benchmarks.rotation_bound_bench import ORIGIN, _fill, _rotate, sqlite_log
from benchmarks.side_by_side import side_by_side_main

MODULE, SIZES = "benchmarks.retired_below_bench", {"entries": 2000}


def _timed(runs: int, verify: Any) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        verify()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def single(backend: str, calls: int, entries: int) -> dict[str, float]:
    with sqlite_log(backend) as (folder, ring, log):
        first = ring.current().public_key()
        _fill(log, 0, entries)
        old, new = folder / "old.jsonl", folder / "new.jsonl"
        export_jsonl(log, old)
        _fill(log, entries, entries // 10)
        point = log.size()
        log.checkpoint()
        _rotate(ring, log)
        _fill(log, point, entries // 10)
        export_jsonl(log, new)
        history = json.loads(ring.history_path.read_text())
        extra: dict[str, Any] = {}
        if "rotation_proof" in inspect.signature(verify_export).parameters:
            hashes = log.consistency_proof(entries, point)
            extra["rotation_proof"] = [base64.b64encode(h).decode() for h in hashes]
        figures = {
            "verify_old_ms": _timed(
                calls, lambda: verify_export(old, first, ORIGIN, key_history=history, **extra)
            ),
            "verify_new_ms": _timed(
                calls, lambda: verify_export(new, first, ORIGIN, key_history=history)
            ),
        }
    return figures


def main() -> None:
    side_by_side_main(MODULE, __doc__.splitlines()[0], single, calls=5, sizes=SIZES)


if __name__ == "__main__":
    main()
