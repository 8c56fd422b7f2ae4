"""The offline verifier's cost per line of an audit export (decision 0254-audit-verifier-cost).

Builds a SQLite audit log of ``--small`` and of ``--large`` entries, exports each whole as
JSONL and as CSV, and times ``verify_export`` of each file ``--calls`` times; reports the
median microseconds per line (wall clock, and the process's CPU time, which load from other
processes on the machine moves less) and, for a filtered export of the large log (one
entry in 17: the inclusion proofs of sparse leaves share little of their paths), the same.

Run: ``.venv/bin/python -m benchmarks.verify_cost_bench --other <checkout>`` compares this
tree with another, one fresh process per tree and round, alternately (``side_by_side``); a
checkout from before this benchmark needs this file copied into its ``benchmarks/``.
"""

from __future__ import annotations

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

from audit.export import export_csv, export_jsonl
from audit.log import AuditLog
from audit.tables import create_tables
from audit.verify import verify_export
from benchmarks.audit_bench import _entry  # the same entries as the audit bench
from benchmarks.side_by_side import side_by_side_main
from uprof.backends import backend_for
from uprof.retry import AUDIT_APPEND

ORIGIN = "uprof.bench/verify-cost"


def _log(path: Path, entries: int, key: Ed25519PrivateKey) -> tuple[AuditLog, sa.Engine]:
    engine = sa.create_engine(f"sqlite:///{path}")
    create_tables(engine, backend_for(engine))
    log = AuditLog(engine, key, ORIGIN, backend=backend_for(engine), retry=AUDIT_APPEND.call)
    for start in range(0, entries, 1000):
        log.append_many(_entry(i) for i in range(start, min(start + 1000, entries)))
    return log, engine


def _per_line(path: Path, key: Any, calls: int) -> tuple[float, float]:
    """Median wall and CPU microseconds per line of verifying ``path``."""
    lines = path.read_bytes().count(b"\n")
    verify_export(path, key, ORIGIN)  # warm: imports, first reads
    wall, cpu = [], []
    for _ in range(calls):
        started, used = time.perf_counter(), time.process_time()
        verify_export(path, key, ORIGIN)
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - used)
    return (
        statistics.median(wall) / lines * 1e6,
        statistics.median(cpu) / lines * 1e6,
    )


def single(backend: str, *, calls: int, small: int, large: int) -> dict[str, float]:
    """One measurement in this process (``backend``: only SQLite; the verifier reads files)."""
    if backend != "sqlite":
        raise SystemExit("the verifier reads files: --backend sqlite only")
    key = Ed25519PrivateKey.generate()
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        for label, entries in (("small", small), ("large", large)):
            log, engine = _log(folder / f"{label}.sqlite", entries, key)
            try:
                trails = {"jsonl": folder / f"{label}.jsonl", "csv": folder / f"{label}.csv"}
                export_jsonl(log, trails["jsonl"])
                export_csv(log, trails["csv"])
                if label == "large":
                    trails["filtered"] = folder / "filtered.jsonl"
                    export_jsonl(log, trails["filtered"], app_id="app-3")
            finally:
                engine.dispose()
            for kind, path in trails.items():
                wall, cpu = _per_line(path, key.public_key(), calls)
                out[f"{kind}_{label}_us_per_line"] = round(wall, 2)
                out[f"{kind}_{label}_cpu_us_per_line"] = round(cpu, 2)
    return out


def main() -> None:
    side_by_side_main(
        "benchmarks.verify_cost_bench",
        __doc__,
        single,
        calls=5,
        sizes={"small": 1_000, "large": 10_000},
        rounds=5,
    )


if __name__ == "__main__":
    main()
