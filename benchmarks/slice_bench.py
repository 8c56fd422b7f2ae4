"""Slice latency through the whole service: gate, rank, pack, record, audit.

``uprof bench slice [--memories 5000] [--queries 200]``: one subject with N memories
captured through the public API (MiniLM embeddings computed by the projection), then
repeated slices at B=1024, hybrid and lexical-only, side by side in one run. Each
slice includes identity resolution, the read-your-writes check, the policy, consent
and visibility gate, ranking, packing, and recording the ``SliceServed`` event and
its audit entry: handed to the recorder thread by default (``read_recording=async``),
written before the slice returns as the baseline beside it (``sync``). Reported:
p50/p95 per mode and recording, their ratios, and the time spent embedding the query.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.kernel_bench import SENTENCES, deployment
from domain.values import Interaction

APP, AGENT, PURPOSE = "app:planner", "agent:bench", "personalization"
TOPICS = ("cello", "marathon", "kitchen", "passport", "garden", "Lisbon", "sister", "budget")


def _interaction(i: int, start: datetime) -> Interaction:
    topic = TOPICS[i % len(TOPICS)]
    return Interaction(
        app_id=APP,
        agent_id=AGENT,
        occurred_at=start + timedelta(minutes=i),
        user_input=f"{SENTENCES[i % len(SENTENCES)]} Also something about the {topic} ({i}).",
        session_id=f"s{i // 40}",
        source_ref=f"B:{i}",
        sharing="shared",
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(memories: int, queries: int) -> dict[str, Any]:
    with deployment("sqlite", embedder="minilm") as k:
        k.grant_consent("bench", app_id=APP, categories=["*"], purposes=[PURPOSE])
        start = datetime(2025, 1, 1, tzinfo=UTC)
        for lo in range(0, memories, 1_000):
            k.capture_many(
                "bench", [_interaction(i, start) for i in range(lo, min(memories, lo + 1_000))]
            )
        k.process()
        questions = [f"What did I say about the {t}?" for t in TOPICS]
        embed_ms = []
        embedder = k.slice_service._embedder
        for q in questions * 3:
            began = time.perf_counter()
            embedder.embed([q])
            embed_ms.append((time.perf_counter() - began) * 1000)
        result: dict[str, Any] = {
            "memories": memories,
            "queries": queries,
            "budget_tokens": 1024,
            "query_embedding_p50_ms": round(statistics.median(embed_ms), 2),
        }
        for recording in ("async", "sync"):
            k.reads.drain()
            k.reads.mode = recording  # the deployment's setting, switched for the baseline
            timings = {
                mode: _time_slices(k, questions, queries, lexical=lexical)
                for mode, lexical in (("hybrid", False), ("lexical_only", True))
            }
            target = result if recording == "async" else result.setdefault("sync_recording", {})
            for mode, samples in timings.items():
                target[mode] = {
                    "p50_ms": round(statistics.median(samples), 2),
                    "p95_ms": round(percentile(samples, 0.95), 2),
                }
        result["ratio_async_to_sync_p50"] = {
            mode: round(result[mode]["p50_ms"] / result["sync_recording"][mode]["p50_ms"], 3)
            for mode in ("hybrid", "lexical_only")
        }
        return result


def _time_slices(k: Any, questions: list[str], queries: int, *, lexical: bool) -> list[float]:
    """Milliseconds per slice, after one warm-up slice (it builds the subject's view)."""

    def one(question: str) -> None:
        k.slice(
            "bench",
            question,
            budget_tokens=1024,
            purpose=PURPOSE,
            app_id=APP,
            agent_id=AGENT,
            lexical_only=lexical,
        )

    one(questions[0])
    timings = []
    for n in range(queries):
        began = time.perf_counter()
        one(questions[n % len(questions)])
        timings.append((time.perf_counter() - began) * 1000)
    return timings


def main(out: Path, memories: int, queries: int, echo: Callable[[str], None]) -> dict[str, Any]:
    result = run(memories, queries)
    result["measured_at"] = datetime.now(tz=UTC).isoformat(timespec="seconds")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    echo(json.dumps(result, indent=2))
    return result
