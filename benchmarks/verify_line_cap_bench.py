"""What the line cap (KX) and the fixed csv limit (KY) cost the offline verifier
(decision 0169-small-leftovers).

Builds a SQLite audit log of ``--entries`` entries, exports it as JSONL and as CSV, and
times ``verify_export`` of each file, ``--repeat`` times; prints the medians (ms) and the
peak memory (tracemalloc) of verifying a sparse file whose first line is 256 MiB, as JSON.
Run from a tree before the change, it times what that tree has; run both side by side.

Run: ``.venv/bin/python benchmarks/verify_line_cap_bench.py`` (defaults: 5,000 entries).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

try:
    import audit  # noqa: F401  (installed by `make setup`)
except ImportError:  # run from a source tree without the editable install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.errors import VerificationError
from audit.export import export_csv, export_jsonl
from audit.log import AuditLog
from audit.tables import create_tables
from audit.verify import verify_export
from uprof.backends import backend_for
from uprof.retry import AUDIT_APPEND

ORIGIN = "uprof.bench/verify"
HUGE = 256 * 1024 * 1024


def _entry(i: int) -> dict[str, Any]:
    return {
        "action": ("AccessDecision", "consent.granted", "subject.read")[i % 3],
        "app_id": f"app-{i % 17}",
        "subject_ref": f"subj_{i % 5003:06d}",
        "purpose": "personalization",
        "item_refs": [f"item-{i}-{j}" for j in range(i % 7)],
        "counts": {"items": i % 13},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        engine = sa.create_engine(f"sqlite:///{root / 'audit.db'}")
        backend = backend_for(engine)
        create_tables(engine, backend)
        key = Ed25519PrivateKey.generate()
        log = AuditLog(engine, key, ORIGIN, backend=backend, retry=AUDIT_APPEND.call)
        for start in range(0, args.entries, 500):
            log.append_many(_entry(i) for i in range(start, min(start + 500, args.entries)))
        result: dict[str, Any] = {"entries": args.entries, "repeat": args.repeat}
        for name, write in (("jsonl", export_jsonl), ("csv", export_csv)):
            path = root / f"trail.{name}"
            write(log, path)
            times = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                verify_export(path, log.public_key, ORIGIN)
                times.append((time.perf_counter() - started) * 1000)
            result[f"verify_{name}_ms_median"] = round(statistics.median(times), 1)
        huge = root / "huge.jsonl"
        with huge.open("wb") as handle:
            handle.write(b'{"checkpoint":"')
            handle.truncate(HUGE)
        tracemalloc.start()
        try:
            verify_export(huge, log.public_key, ORIGIN)
        except VerificationError as error:
            result["huge_line_refused"] = error.reason
        result["huge_line_peak_mb"] = round(tracemalloc.get_traced_memory()[1] / 1e6, 1)
        tracemalloc.stop()
        engine.dispose()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
