"""The start's sweep for erasure requests without an outcome, against past erasures.

``ErasureService.settle_abandoned`` runs at every start (decision 0141, bug GY). This
measures it after N past erasure requests, each with its outcome on the audit log
(``erasure.requested`` then ``projection.purged``, written straight to the log: the
sweep reads only those entries and the ledger, so real erasures would measure the same
sweep at far more set-up time). Two sweeps per N: the first start after the N requests
(``first_ms``), then the median of 5 later starts (``later_ms``; with a settled-up-to
mark these read only the entries after it).

Prints one JSON line per N. Compare trees by running this file by its path with
``PYTHONPATH`` set to each tree in turn, alternating which goes first:

    PYTHONPATH=<tree> python benchmarks/settle_sweep_bench.py sqlite|postgres [N ...]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import uuid

from benchmarks.kernel_bench import deployment

BATCH = 500


def fill(k: object, n: int) -> None:
    audit = k.audit  # type: ignore[attr-defined]
    for start in range(0, n, BATCH):
        entries: list[tuple[str, dict[str, object]]] = []
        for _ in range(min(BATCH, n - start)):
            request = str(uuid.uuid4())
            pseudonym = uuid.uuid4().hex
            entries.append(
                (
                    "erasure.requested",
                    {"subject_ref": pseudonym, "request_id": request, "reason_code": "subject"},
                )
            )
            entries.append(
                (
                    "projection.purged",
                    {"subject_ref": pseudonym, "request_id": request, "reason_code": "subject"},
                )
            )
        audit.record_many(entries)


def sweep_ms(k: object) -> float:
    began = time.perf_counter()
    k.erasure_service.settle_abandoned()  # type: ignore[attr-defined]
    return (time.perf_counter() - began) * 1000


def main(backend: str, sizes: list[int]) -> None:
    for n in sizes:
        with deployment(backend) as k:
            fill(k, n)
            first = sweep_ms(k)
            later = statistics.median(sweep_ms(k) for _ in range(5))
        print(
            json.dumps(
                {
                    "backend": backend,
                    "erasures": n,
                    "first_ms": round(first, 2),
                    "later_ms": round(later, 2),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1], [int(a) for a in sys.argv[2:]] or [0, 1_000, 10_000])
