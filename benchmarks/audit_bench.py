"""Benchmark the audit log on SQLite: append throughput, proof latency, export and verification,
and serving and verifying a proof document (``audit.proofs``) against the unfiltered export.

Run: ``.venv/bin/python benchmarks/audit_bench.py`` (defaults: 100,000 entries in batches of
1,000, 3 runs). Prints one JSON object with the median and every run of each measure.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    import audit  # noqa: F401  (installed by `make setup`)
except ImportError:  # run from a source tree without the editable install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.checkpoint import sign_checkpoint
from audit.export import export_jsonl
from audit.log import AuditLog
from audit.proofs import build_proof, proof_bytes, verify_proof
from audit.tables import create_tables
from audit.verify import verify_export
from uprof.backends import backend_for
from uprof.retry import AUDIT_APPEND

ORIGIN = "uprof.bench/audit"


def _entry(i: int) -> dict[str, Any]:
    return {
        "action": ("AccessDecision", "consent.granted", "KeyCreated")[i % 3],
        "app_id": f"app-{i % 17}",
        "subject_ref": f"sub_{i % 5003:06d}",
        "purpose": "personalization",
        "categories": ["diet", "preference"],
        "decision": "allow",
        "counts": {"items": i % 13},
    }


def one_run(entries: int, batch: int, workdir: Path, seed: int) -> dict[str, float]:
    """Fill a fresh SQLite log, then time proofs, an unfiltered export and its verification."""
    engine = sa.create_engine(f"sqlite:///{workdir / f'bench-{seed}.sqlite'}")
    try:
        create_tables(engine, backend_for(engine))
        key = Ed25519PrivateKey.generate()
        log = AuditLog(engine, key, ORIGIN, backend=backend_for(engine), retry=AUDIT_APPEND.call)

        started = time.perf_counter()
        for start in range(0, entries, batch):
            log.append_many(_entry(i) for i in range(start, min(start + batch, entries)))
        append_s = time.perf_counter() - started

        rng = random.Random(seed)
        proof_times = []
        for _ in range(50):
            t = time.perf_counter()
            log.inclusion_proof(rng.randrange(entries))
            proof_times.append(time.perf_counter() - t)
        t = time.perf_counter()
        log.consistency_proof(rng.randrange(1, entries))
        consistency_s = time.perf_counter() - t

        # A reader holding a checkpoint of an older size asks for a proof document (fresh
        # checkpoint, consistency proof, one entry's inclusion proof) and checks it offline.
        old_size = rng.randrange(1, entries + 1)
        trusted = sign_checkpoint(key, ORIGIN, old_size, log.root(old_size))
        serve_times, check_times = [], []
        for _ in range(20):
            t = time.perf_counter()
            document = proof_bytes(build_proof(log, old_size, leaf_index=old_size - 1))
            serve_times.append(time.perf_counter() - t)
            t = time.perf_counter()
            verify_proof(document, key.public_key(), ORIGIN, trusted=trusted)
            check_times.append(time.perf_counter() - t)

        path = workdir / f"bench-{seed}.jsonl"
        t = time.perf_counter()
        export_jsonl(log, path)
        export_s = time.perf_counter() - t

        t = time.perf_counter()
        report = verify_export(path, key.public_key(), ORIGIN)
        verify_s = time.perf_counter() - t
        if report.entry_count != entries:
            raise SystemExit(f"verified {report.entry_count} entries, expected {entries}")
        return {
            "append_seconds": append_s,
            "append_entries_per_s": entries / append_s,
            "inclusion_proof_ms": statistics.median(proof_times) * 1000,
            "consistency_proof_ms": consistency_s * 1000,
            "export_entries_per_s": entries / export_s,
            "verify_seconds": verify_s,
            "verify_entries_per_s": entries / verify_s,
            "export_bytes": path.stat().st_size,
            "proof_serve_ms": statistics.median(serve_times) * 1000,
            "proof_verify_ms": statistics.median(check_times) * 1000,
            "proof_bytes": len(document),
            "export_seconds": export_s,
            "export_and_verify_seconds": export_s + verify_s,
        }
    finally:
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as scratch:
        workdir = args.workdir or Path(scratch)
        runs = [one_run(args.entries, args.batch, workdir, seed) for seed in range(args.runs)]
    result: dict[str, Any] = {
        "benchmark": "audit",
        "backend": f"sqlite {sa.__version__}",
        "entries": args.entries,
        "batch": args.batch,
        "runs": args.runs,
    }
    for measure in runs[0]:
        values = [run[measure] for run in runs]
        result[measure] = {
            "median": round(statistics.median(values), 3),
            "runs": [round(v, 3) for v in values],
        }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
