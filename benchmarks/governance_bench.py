"""Governance figures: erasure time for a large subject, residue after it, audit overhead.

``uprof bench governance [--backend sqlite|postgres] [--events 10000] [--subjects 3]``

* erasure: subjects with N captured events each (plus their extraction results) are
  erased one by one; the time of ``erase_subject`` (tombstone, key destruction,
  purge, WAL checkpoint, signed receipt) is reported as a median, and the residue
  scan over every store must report 0;
* audit overhead: slice latency with the real audit log against the same deployment
  whose audit trail records nothing, side by side in one run; reported as a ratio.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.kernel_bench import APP, capture_batched, deployment, grant


class _SilentTrail:
    """An audit trail that records nothing: the baseline for the overhead ratio only."""

    def record(self, action: str, **fields: object) -> None:
        return None

    def record_many(self, entries: object) -> None:
        return None


def measure_erasure(backend: str, events: int, subjects: int) -> dict[str, Any]:
    timings = []
    findings = 0
    with deployment(backend) as k:
        names = [f"person-{i}" for i in range(subjects)]
        for i, name in enumerate(names):
            grant(k, name)
            capture_batched(k, name, events, 1_000, offset=i * 10_000_000)
        k.process()
        log_events = k.app.max_notification_id()
        for name in names:
            began = time.perf_counter()
            k.erase_subject(name)
            timings.append(time.perf_counter() - began)
        report = k.residue_scan(["Porto", "Miso", "cello", "renovation"])
        findings = len(report.findings)
    return {
        "backend": backend,
        "events_per_subject": events,
        "log_events": log_events,
        "subjects_erased": subjects,
        "erase_p50_s": round(statistics.median(timings), 3),
        "erase_max_s": round(max(timings), 3),
        "residue_findings": findings,
    }


def _slice_p50(k: Any, n: int) -> float:
    timings = []
    for i in range(n):
        began = time.perf_counter()
        k.slice(
            "bench",
            f"what did I say about turn {i}",
            budget_tokens=1024,
            purpose="personalization",
            app_id=APP,
            agent_id="agent:bench",
        )
        timings.append((time.perf_counter() - began) * 1000)
    return statistics.median(timings)


def measure_audit_overhead(backend: str, memories: int, slices: int) -> dict[str, Any]:
    from benchmarks.uprof_system import bench_authorizer  # the bench app may read

    results = {}
    for label, audit in (("audited", None), ("silent", _SilentTrail())):
        with deployment(backend, audit=audit, authorizer=bench_authorizer()) as k:
            k.grant_consent("bench", app_id=APP, categories=["*"], purposes=["personalization"])
            capture_batched(k, "bench", memories, 1_000)
            k.process()
            _slice_p50(k, 5)  # warm the subject's index
            results[label] = _slice_p50(k, slices)
    return {
        "backend": backend,
        "memories": memories,
        "slice_p50_ms_with_audit": round(results["audited"], 2),
        "slice_p50_ms_without_audit": round(results["silent"], 2),
        "audit_overhead_ratio": round(results["audited"] / results["silent"] - 1.0, 3),
    }


def main(
    backend: str, out: Path, events: int, subjects: int, echo: Callable[[str], None]
) -> dict[str, Any]:
    result = {
        "measured_at": datetime.now(tz=UTC).isoformat(timespec="seconds"),
        "erasure": measure_erasure(backend, events, subjects),
        "audit_overhead": measure_audit_overhead(backend, 2_000, 100),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    echo(json.dumps(result, indent=2))
    return result
