"""What reading the audit log per tenant costs (decision 0089-audit-per-tenant), on SQLite.

Times, on a log of ``--entries`` entries (every one naming a tenant, as the audit trail
writes them): one append of one entry; a page of 50 entries read after a random leaf,
as the facade reads one (``page_size`` 51), without a tenant scope (the code before) and
with one (the code after: ``tenant_scope`` then a scoped read); the first ``tenant_scope``
of a process (it reads every entry once); and, on a log shared with another tenant that
wrote 99% of it, a page of the small tenant. Medians of ``--repeat`` timings, as JSON.
Run from a tree before the change, it times what that tree has (no scoped reads).

Run: ``.venv/bin/python benchmarks/audit_tenant_bench.py`` (defaults: 100,000 entries).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import audit  # noqa: F401  (installed by `make setup`)
except ImportError:  # run from a source tree without the editable install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.log import AuditLog
from audit.tables import create_tables
from uprof.backends import backend_for
from uprof.retry import AUDIT_APPEND

ORIGIN = "uprof.bench/audit-tenants"
PAGE = 50


def _entry(i: int, tenant: str) -> dict[str, Any]:
    return {
        "action": ("AccessDecision", "consent.granted", "key.created")[i % 3],
        "tenant": tenant,
        "principal": f"app:app-{i % 17}#k1",
        "app_id": f"app-{i % 17}",
        "subject_ref": f"subj_{i % 5003:06d}",
        "purpose": "personalization",
        "counts": {"items": i % 13},
    }


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def _log(path: Path) -> tuple[sa.Engine, AuditLog]:
    engine = sa.create_engine(f"sqlite:///{path}")
    create_tables(engine, backend_for(engine))
    log = AuditLog(
        engine,
        Ed25519PrivateKey.generate(),
        ORIGIN,
        backend=backend_for(engine),
        retry=AUDIT_APPEND.call,
    )
    return engine, log


def run(entries: int, repeat: int, workdir: Path) -> dict[str, Any]:
    scoped = hasattr(AuditLog, "tenant_scope")
    rng = random.Random(7)
    out: dict[str, Any] = {"entries": entries, "tenant_scoped_reads": scoped}

    engine, log = _log(workdir / "single.sqlite")
    for start in range(0, entries, 1000):
        log.append_many(_entry(i, "acme") for i in range(start, min(start + 1000, entries)))
    counter = itertools.count(entries)
    out["append_one_ms"] = _median_ms(lambda: log.append(_entry(next(counter), "acme")), repeat)

    def page(scope_of: Callable[[], Any] | None) -> None:
        after = rng.randrange(entries - PAGE)
        extra = {} if scope_of is None else {"scope": scope_of()}
        rows = list(
            itertools.islice(log.entries(after_leaf=after, page_size=PAGE + 1, **extra), PAGE + 1)
        )
        assert len(rows) == PAGE + 1

    out["page_unscoped_ms"] = _median_ms(lambda: page(None), repeat)
    if scoped:
        fresh = AuditLog(engine, Ed25519PrivateKey.generate(), ORIGIN, backend=backend_for(engine))
        t = time.perf_counter()
        fresh.tenant_scope("acme")
        out["first_tenant_scope_ms"] = (time.perf_counter() - t) * 1000
        log.tenant_scope("acme")
        out["page_scoped_ms"] = _median_ms(lambda: page(lambda: log.tenant_scope("acme")), repeat)
        out["page_ratio_scoped_to_unscoped"] = out["page_scoped_ms"] / out["page_unscoped_ms"]
    engine.dispose()

    if scoped:
        engine, log = _log(workdir / "shared.sqlite")
        small = [i for i in range(entries) if i % 100 == 0]
        for start in range(0, entries, 1000):
            log.append_many(
                _entry(i, "small" if i % 100 == 0 else "big")
                for i in range(start, min(start + 1000, entries))
            )
        scope = log.tenant_scope("small")

        def small_page() -> None:
            after = small[rng.randrange(len(small) - PAGE - 1)]
            rows = list(
                itertools.islice(
                    log.entries(after_leaf=after, page_size=PAGE + 1, scope=scope), PAGE + 1
                )
            )
            assert len(rows) == PAGE + 1

        out["page_small_tenant_1pct_ms"] = _median_ms(small_page, repeat)
        engine.dispose()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(run(args.entries, args.repeat, Path(tmp)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
