"""What re-applying the erasure ledger costs each start (decision 0012).

    python -m benchmarks.ledger_bench --erased 0 1000 10000 --repeats 5 [--postgres]

Appends N synthetic subject erasures and N/2 capture erasures (random ids) to a
fresh deployment's ledger and times ``reapply_ledger`` (a start's extra work) and a
whole ``bootstrap``; prints medians in milliseconds, N=0 as the baseline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.reliability import Target, open_kernel, temp_target


def measure(target: Target, erased: int, repeats: int) -> dict[str, Any]:
    from uprof.services.recovery import reapply_ledger

    kernel = open_kernel(target)
    ledger = kernel.keystore.ledger
    for _ in range(erased):
        ledger.record_subject("default", None, str(uuid.uuid4()))
    for _ in range(erased // 2):
        ledger.record_captures("default", str(uuid.uuid4()), [uuid.uuid4().hex])
    reapply_ledger(kernel)
    kernel.close()
    reapply_ms, start_ms = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        kernel = open_kernel(target)
        start_ms.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        reapply_ledger(kernel)
        reapply_ms.append((time.perf_counter() - t0) * 1000)
        kernel.close()
    return {
        "erased_subjects": erased,
        "erased_captures": erased // 2,
        "reapply_ms_median": round(statistics.median(reapply_ms), 1),
        "bootstrap_ms_median": round(statistics.median(start_ms), 1),
        "repeats": repeats,
    }


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ledger_bench", description=__doc__)
    p.add_argument("--erased", type=int, nargs="+", default=[0, 1000, 10000])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--postgres", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    rows = []
    for n in args.erased:
        with temp_target("postgres" if args.postgres else "sqlite") as target:
            rows.append({"backend": target.kind, **measure(target, n, args.repeats)})
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
