"""One round of the cost of decision 0101-capture-accepted-reconciled, on the code it runs from.

Built from ``benchmarks.kernel_bench``'s parts (rules extractor, hashing embedder), with
``UPROF_LATE_CAPTURE_CHECK_S=0`` set by the caller so that every extraction batch is
checked inside the measured run (the default waits 60 s, after the run):

- ``pipeline_events_per_s``: ``measure_pipeline`` (2,000 captured events of one subject,
  requests of 500, extracted and projected in batches of 256);
- ``pipeline_many_events_per_s``: 2,000 events of 100 subjects in requests of 10 (each
  batch checks about 13 subjects and cuts one or two requests, which costs a look-ahead);
- ``check_ms_per_batch``: on code that has the check, the time ``LateCaptures`` spent
  per checked batch in the second run (None on older code).
- ``move_ms_per_check`` and ``moves``: on code whose check has a durable position
  (decision 0112-late-check-durable), the time spent saving it per save, and how many
  saves the second run made (one per pipeline run that checked something; None on
  older code).

Prints one JSON line. Interleave rounds with a checkout of older code by running this
file (by its path: older trees lack it) with ``PYTHONPATH`` set to each tree in turn,
alternating which goes first:

    UPROF_LATE_CAPTURE_CHECK_S=0 PYTHONPATH=<tree> python benchmarks/late_captures_bench.py sqlite
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from benchmarks.kernel_bench import Sizes, capture_batched, deployment, grant, measure_pipeline


def main(backend: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["pipeline_events_per_s"] = measure_pipeline(
        backend, Sizes(0, 0, 0, 0, 2_000, 0, 1), "hashing"
    )["extraction_plus_projection_events_per_s"]
    with deployment(backend) as k:
        subjects = [f"bench-{i}" for i in range(100)]
        for s in subjects:
            grant(k, s)
        for n, s in enumerate(subjects):
            capture_batched(k, s, 20, 10, offset=n * 1_000)
        late = getattr(k.extraction, "_late", None)
        spent = [0.0, 0]
        if late is not None:
            reconcile = late._reconcile

            def timed(*args: Any) -> Any:
                began = time.perf_counter()
                try:
                    return reconcile(*args)  # whether it asked the store
                finally:
                    spent[0] += time.perf_counter() - began
                    spent[1] += 1

            late._reconcile = timed
        moved = [0.0, 0]
        move = getattr(late, "_move", None)
        if late is not None and move is not None:

            def timed_move(*args: Any) -> None:
                began = time.perf_counter()
                try:
                    move(*args)
                finally:
                    moved[0] += time.perf_counter() - began
                    moved[1] += 1

            late._move = timed_move
        began = time.perf_counter()
        k.process()
        out["pipeline_many_events_per_s"] = round(2_000 / (time.perf_counter() - began), 1)
        out["check_ms_per_batch"] = (
            round(1000 * spent[0] / spent[1], 3) if late is not None and spent[1] else None
        )
        out["checked_batches"] = spent[1] if late is not None else None
        out["recorded_late"] = getattr(late, "recorded", None)
        out["move_ms_per_check"] = (
            round(1000 * moved[0] / moved[1], 3) if move is not None and moved[1] else None
        )
        out["moves"] = moved[1] if move is not None else None
    return out


if __name__ == "__main__":
    print(json.dumps({"backend": sys.argv[1], **main(sys.argv[1])}))
