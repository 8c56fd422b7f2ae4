"""What the erasure ledger costs: re-applying it each start (decision 0012), and asking it
on every key lookup (decision 0052).

    python -m benchmarks.ledger_bench --erased 0 1000 10000 --repeats 5 [--postgres]
    python -m benchmarks.ledger_bench --key-lookups --erased 0 1000 10000 [--postgres]

Appends N synthetic subject erasures and N/2 capture erasures (random ids) to a
fresh deployment's ledger and times ``reapply_ledger`` (a start's extra work) and a
whole ``bootstrap``; prints medians in milliseconds, N=0 as the baseline.

With ``--key-lookups``: times cached key lookups (a capture key and a DEK, as decrypting
one captured event does) with the ledger asked, as shipped, against the same store with
its ledger detached (the code before decision 0052), in alternating rounds; prints the
median microseconds per pair and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.reliability import Target, open_kernel, temp_target

if TYPE_CHECKING:
    from uprof.crypto.ledger import ErasureLedger
    from uprof.kernel import Uprof


def ledger_of(kernel: Uprof) -> ErasureLedger:
    """The deployment's erasure ledger (every bootstrapped deployment keeps one)."""
    ledger = kernel.keystore.ledger
    if ledger is None:
        raise RuntimeError("this deployment keeps no erasure ledger: nothing to measure")
    return ledger


def measure(target: Target, erased: int, repeats: int) -> dict[str, Any]:
    from uprof.services.recovery import reapply_ledger

    kernel = open_kernel(target)
    ledger = ledger_of(kernel)
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


def key_lookups(target: Target, erased: int, rounds: int, pairs: int = 20_000) -> dict[str, Any]:
    from benchmarks.reliability import grant_all, interaction

    kernel = open_kernel(target)
    try:
        ledger = ledger_of(kernel)
        for _ in range(erased):
            ledger.record_subject("default", None, str(uuid.uuid4()))
        for _ in range(erased // 2):
            ledger.record_captures("default", str(uuid.uuid4()), [uuid.uuid4().hex])
        grant_all(kernel, "alice")
        acks = kernel.capture_many("alice", [interaction(f"note {i}") for i in range(50)])
        stream = str(kernel.stream_of("alice"))
        ids = [a.capture_id for a in acks]
        keys = kernel.keystore
        for cid in ids:
            assert keys.capture_key(stream, cid) is not None  # warm: every lookup is a hit

        def per_pair_us() -> float:
            t0 = time.perf_counter()
            for i in range(pairs):
                keys.capture_key(stream, ids[i % len(ids)])
                keys.key(stream, 1)
            return (time.perf_counter() - t0) / pairs * 1e6

        asked: list[float] = []
        detached: list[float] = []
        for r in range(rounds):
            order = [(ledger, asked), (None, detached)]
            for attached, out in order if r % 2 == 0 else order[::-1]:
                keys.ledger = attached
                out.append(per_pair_us())
        keys.ledger = ledger
    finally:
        kernel.close()
    a, d = statistics.median(asked), statistics.median(detached)
    return {
        "ledger_records": erased + erased // 2,
        "us_per_pair_ledger_asked": round(a, 2),
        "us_per_pair_ledger_detached": round(d, 2),
        "ratio": round(a / d, 2),
        "rounds": rounds,
        "pairs_per_round": pairs,
    }


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ledger_bench", description=__doc__)
    p.add_argument("--erased", type=int, nargs="+", default=[0, 1000, 10000])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--postgres", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--key-lookups", action="store_true", help="time key lookups instead")
    args = p.parse_args()
    rows = []
    for n in args.erased:
        with temp_target("postgres" if args.postgres else "sqlite") as target:
            if args.key_lookups:
                rows.append({"backend": target.kind, **key_lookups(target, n, args.repeats)})
            else:
                rows.append({"backend": target.kind, **measure(target, n, args.repeats)})
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
