"""The residue audit on a deployment of real size: many subjects, some erased, many terms.

``python -m benchmarks.residue_scale_bench [--backend sqlite postgres] [--subjects 200]
[--captures 100] [--erase 20] [--terms 1 5 20] [--runs 3]``

Each backend gets ``subjects`` x ``captures`` captures (batched, then extracted and
projected with the hashing embedder) and ``erase`` erased subjects. Then, per term
count, the whole audit (``Uprof.residue_scan``: the data folder's files through the
child process, the database's tables, the erased streams' checks) runs ``runs`` times;
on PostgreSQL the table scan alone is also timed side by side with the queries it
replaced (``per_column_scan``: one query per column per term), alternating, with the
findings of both compared. Terms: half are words of the erased subjects only (what an
auditor asks about), half are words every subject said (so the scan finds and reports
rows of living subjects, its worst case); one of them has letters outside ASCII.
Medians in seconds; the JSON goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import sqlalchemy as sa

from benchmarks.kernel_bench import APP, SENTENCES, deployment, grant
from domain.values import Interaction
from uprof.backends import TableScan, TermHit, backend_for
from uprof.kernel import Uprof

COMMON_WORDS = ["Porto", "cello", "Miso", "renovation", "gym", "daughter", "Zoë", "weekends"]


def per_column_scan(engine: sa.Engine, terms: Sequence[str]) -> TableScan:
    """The PostgreSQL table scan before decision 0187: one query per column per term,
    all in one transaction (the baseline, and the reference of the same-answers test)."""
    inspector = sa.inspect(engine)
    tables, hits = 0, []
    with engine.connect() as conn:
        for table_name in inspector.get_table_names():
            tables += 1
            for column in inspector.get_columns(table_name):
                name = column["name"]
                kind = str(column["type"]).upper()
                expr = (
                    f"encode(\"{name}\"::bytea, 'escape')"
                    if "BYTEA" in kind or "LARGEBINARY" in kind
                    else f'"{name}"::text'
                )
                for term in terms:
                    rows = conn.execute(
                        sa.text(
                            f'SELECT ctid::text FROM "{table_name}" '
                            f"WHERE position(lower(:term) in lower({expr})) > 0 LIMIT 5"
                        ),
                        {"term": term},
                    ).scalars()
                    hits += [TermHit(table_name, name, ctid, term) for ctid in rows]
    return TableScan(tables, hits)


def _said(subject: int, turn: int, start: datetime) -> Interaction:
    return Interaction(
        app_id=APP,
        agent_id="agent:bench",
        occurred_at=start + timedelta(seconds=turn),
        user_input=(
            f"{SENTENCES[turn % len(SENTENCES)]} Zoë says hi to Qzxfriend{subject}x{turn % 7} "
            f"from Qzxtown{subject} (turn {turn})"
        ),
        session_id=f"s{turn // 50}",
        source_ref=f"R:{subject}:{turn}",
        sharing="shared",
    )


def seed(k: Uprof, subjects: int, captures: int, erase: int) -> dict[str, float]:
    start = datetime(2025, 1, 1, tzinfo=UTC)
    began = time.perf_counter()
    for s in range(subjects):
        grant(k, f"person-{s}")
        k.capture_many(f"person-{s}", [_said(s, i, start) for i in range(captures)])
    captured = time.perf_counter()
    k.process()
    processed = time.perf_counter()
    for s in range(erase):
        k.erase_subject(f"person-{s}")
    return {
        "capture_s": round(captured - began, 1),
        "process_s": round(processed - captured, 1),
        "erase_s": round(time.perf_counter() - processed, 1),
    }


def terms_of(count: int, erased: int) -> list[str]:
    """``count`` terms: the erased subjects' own words and words everyone said, alternating."""
    own = [f"Qzxtown{s}" for s in range(max(erased, 1))] + [
        f"Qzxfriend{s}x{t}" for s in range(max(erased, 1)) for t in range(7)
    ]
    terms: list[str] = []
    while len(terms) < count:
        pool = own if len(terms) % 2 == 0 else COMMON_WORDS
        terms.append(pool[(len(terms) // 2) % len(pool)])
    return terms


def _median_s(fn: Callable[[], Any], runs: int) -> tuple[float, list[float], Any]:
    times, last = [], None
    for _ in range(runs):
        began = time.perf_counter()
        last = fn()
        times.append(time.perf_counter() - began)
    return round(statistics.median(times), 3), [round(t, 3) for t in times], last


def _hit_keys(scan: TableScan) -> set[tuple[str, str, str]]:
    return {(h.table, h.column, h.term) for h in scan.hits}


def measure(
    backend: str, subjects: int, captures: int, erase: int, term_counts: Sequence[int], runs: int
) -> dict[str, Any]:
    with deployment(backend) as k:
        out: dict[str, Any] = {
            "backend": backend,
            "subjects": subjects,
            "captures": subjects * captures,
            "erased": erase,
            "runs": runs,
            "seed": seed(k, subjects, captures, erase),
        }
        files = [p for p in k.settings.data_dir.rglob("*") if p.is_file()]
        out["data_folder_bytes"] = sum(p.stat().st_size for p in files)
        audits: dict[str, Any] = {}
        for count in term_counts:
            terms = terms_of(count, erase)
            median, each, report = _median_s(partial(k.residue_scan, terms), runs)
            audits[str(count)] = {
                "median_s": median,
                "runs_s": each,
                "findings": len(report.findings),
                "erased_findings": sum(
                    1 for f in report.findings if f.kind != "plaintext" or "Qzx" in f.detail
                ),
                "tables_scanned": report.tables_scanned,
                "bytes_scanned": report.bytes_scanned,
            }
        out["audit"] = audits
        if backend == "postgres":
            out["table_scan"] = _tables_side_by_side(k.views_engine, erase, term_counts, runs)
        return out


def _tables_side_by_side(
    engine: sa.Engine, erase: int, term_counts: Sequence[int], runs: int
) -> dict[str, Any]:
    """The batched table scan and the per-column queries, alternating, same terms."""
    scan = backend_for(engine).scan_tables
    result: dict[str, Any] = {}
    for count in term_counts:
        terms = terms_of(count, erase)
        batched: list[float] = []
        per_column: list[float] = []
        missed: set[tuple[str, str, str]] = set()
        extra: set[tuple[str, str, str]] = set()
        for _ in range(runs):
            t_b, _, new = _median_s(partial(scan, engine, terms), 1)
            t_p, _, old = _median_s(partial(per_column_scan, engine, terms), 1)
            batched.append(t_b)
            per_column.append(t_p)
            missed |= _hit_keys(old) - _hit_keys(new)
            extra |= _hit_keys(new) - _hit_keys(old)
        b, p = statistics.median(batched), statistics.median(per_column)
        result[str(count)] = {
            "batched_median_s": round(b, 3),
            "per_column_median_s": round(p, 3),
            "per_column_over_batched": round(p / b, 2) if b else None,
            "batched_runs_s": batched,
            "per_column_runs_s": per_column,
            # (table, column, term) the old queries found and the batched scan did not
            # (must be none), and the other way round (the old queries' misses, OQ/OR/OS).
            "missed_by_batched": sorted(map(list, missed)),
            "found_only_by_batched": sorted(map(list, extra)),
        }
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--backend", nargs="+", default=["sqlite", "postgres"])
    p.add_argument("--subjects", type=int, default=200)
    p.add_argument("--captures", type=int, default=100)
    p.add_argument("--erase", type=int, default=20)
    p.add_argument("--terms", type=int, nargs="+", default=[1, 5, 20])
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    results = [
        measure(b, args.subjects, args.captures, args.erase, args.terms, args.runs)
        for b in args.backend
    ]
    print(json.dumps(results, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
