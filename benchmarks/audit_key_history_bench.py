"""What an audit key history costs (decision 0110-audit-key-rotation).

    python -m benchmarks.audit_key_history_bench --keys 1 10 100 1000 --repeats 5

For a history of N keys (N-1 rotations), times, as medians in milliseconds:

- ``history_ms``: ``verify_key_history`` from the first key (every link: two Ed25519
  verifications and a SHA-256 of the previous record each), what an offline verifier
  pays once per file it checks with ``--key-history``;
- ``receipt_ms``: ``verify_receipt`` of a receipt signed by the newest key, with the
  history (the history check included) and, as a baseline, ``receipt_pinned_ms`` with
  the newest key pinned and no history;
- ``checkpoint_ms``: ``verify_checkpoint`` against the N keys (a note key id per key);
- ``current_us``: ``FileKeyRing.current()`` (one ``stat`` per signature, to notice a
  rotation by another process), against ``bare_us`` for a key held in memory;
- ``rotate_ms``: one ``FileKeyRing.rotate()`` (three fsynced writes and a rename).

Receipts come from an in-memory SQLite audit log; nothing else is started.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from audit.checkpoint import verify_checkpoint
from audit.keyring import FileKeyRing, StaticSigningKeys, verify_key_history
from audit.log import AuditLog
from audit.receipts import issue_erasure_receipt, verify_receipt
from audit.tables import create_tables
from uprof.backends import backend_for

ORIGIN = "uprof.bench/audit"


def _median_ms(fn: Callable[[], object], repeats: int, inner: int = 1) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - start) / inner * 1000)
    return statistics.median(samples)


def _receipt(log: AuditLog) -> dict[str, Any]:
    return issue_erasure_receipt(
        log,
        request_id="bench",
        received_at="2026-12-05T00:00:00Z",
        basis="GDPR-Art.17(1)(b)",
        scope="subject",
        tenant="bench",
        subject_commitment="0" * 64,
        actions=[{"type": "tombstone_appended", "stream": "s", "version": 1}],
        residual={"backup_retention_days": 30},
    )


def measure(n: int, repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        ring = FileKeyRing(Path(folder))
        first = ring.current().public_key()
        rotate_ms = []
        for _ in range(n - 1):
            start = time.perf_counter()
            ring.rotate()
            rotate_ms.append((time.perf_counter() - start) * 1000)
        history = ring.history().document
        keys = list(ring.trusted())
        engine = sa.create_engine("sqlite://")
        create_tables(engine, backend_for(engine))
        log = AuditLog(engine, ring, ORIGIN, backend=backend_for(engine))
        for i in range(50):
            log.append({"action": "bench", "request_id": f"r{i}"})
        receipt = _receipt(log)
        newest = ring.current()
        bare = StaticSigningKeys(newest)
        result = {
            "keys": n,
            "history_ms": _median_ms(lambda: verify_key_history(history, first), repeats),
            "receipt_ms": _median_ms(
                lambda: verify_receipt(receipt, first, origin=ORIGIN, key_history=history),
                repeats,
            ),
            "receipt_pinned_ms": _median_ms(
                lambda: verify_receipt(receipt, newest.public_key(), origin=ORIGIN), repeats
            ),
            "checkpoint_ms": _median_ms(
                lambda: verify_checkpoint(receipt["checkpoint"], keys, ORIGIN), repeats
            ),
            "current_us": _median_ms(ring.current, repeats, inner=2000) * 1000,
            "bare_us": _median_ms(bare.current, repeats, inner=2000) * 1000,
            "rotate_ms": statistics.median(rotate_ms) if rotate_ms else None,
        }
        engine.dispose()
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="Also write the rows as JSON.")
    args = parser.parse_args(argv)
    rows = [measure(n, args.repeats) for n in args.keys]
    for row in rows:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}))
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
