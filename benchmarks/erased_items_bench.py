"""One round of the cost of decision 0097-erased-items-not-reborn, on the code it runs from.

Built from ``benchmarks.kernel_bench``'s parts (rules extractor, hashing embedder):

- ``capture_per_s``: batched capture, 10,000 interactions in batches of 1,000
  (``capture_batched``; the change does not touch capture: a control);
- ``pipeline_events_per_s``: ``measure_pipeline`` (2,000 captured events extracted and
  projected; the ledger names no erased item, so each subject's check is one look-up);
- ``pipeline_erased_events_per_s``: the same after one item of the subject was erased
  without its evidence (this code then checks every proposal of the subject against the
  ledger's fingerprints; older code checks nothing).

Prints one JSON line. Interleave rounds with a checkout of older code by running this
file (by its path: older trees lack it) with ``PYTHONPATH`` set to each tree in turn,
alternating which goes first:

    PYTHONPATH=<tree> python benchmarks/erased_items_bench.py sqlite|postgres
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime

from benchmarks.kernel_bench import APP, Sizes, capture_batched, deployment, grant, measure_pipeline
from domain.values import Interaction


def main(backend: str) -> dict[str, float]:
    out: dict[str, float] = {}
    with deployment(backend) as k:
        grant(k, "bench")
        out["capture_per_s"] = capture_batched(k, "bench", 10_000, 1_000)
    out["pipeline_events_per_s"] = measure_pipeline(
        backend, Sizes(0, 0, 0, 0, 2_000, 0, 1), "hashing"
    )["extraction_plus_projection_events_per_s"]
    with deployment(backend) as k:
        grant(k, "bench")
        said = Interaction(
            app_id=APP,
            agent_id="agent:bench",
            occurred_at=datetime(2024, 1, 1, tzinfo=UTC),
            user_input="I want to learn to sail",
            sharing="shared",
        )
        k.capture("bench", said)
        k.process()
        erased = [i.item_id for i in k.profile("bench").intents]
        for item_id in erased:
            k.erase_item("bench", item_id)
        out["erased_items"] = len(erased)
        capture_batched(k, "bench", 2_000, 500)
        began = time.perf_counter()
        k.process()
        out["pipeline_erased_events_per_s"] = 2_000 / (time.perf_counter() - began)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else "sqlite")))
