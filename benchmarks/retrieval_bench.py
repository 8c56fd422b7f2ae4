"""Latency of the retrieval engine: build_slice p50/p95 on a large synthetic subject.

A subject with 5,000 synthetic memories (two speakers, sessions of consecutive
turns over many days, Zipf-distributed vocabulary, sentence lengths like chat
turns) is indexed once; then ``build_slice`` is timed for random questions,
hybrid (random unit embeddings: the cost of the dense path does not depend on
the values) and lexical-only. The one query embedding is excluded, as the
caller computes it once per request. Prints JSON.

    python -m benchmarks.retrieval_bench --memories 5000 --queries 300 --budgets 1024
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from domain.values import Layer, Provenance
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import Candidate, MemoryIndex, build_slice

_VOCABULARY = 4000
_SPEAKERS = ("Caroline", "Melanie")
_TURNS_PER_SESSION = 25


def _word(rank: int) -> str:
    """A pronounceable pseudo-word per rank, so the tokenizer sees word-like text."""
    syllables = ("ka", "lo", "mi", "ren", "tu", "sa", "vel", "no", "ri", "da", "pe", "gor")
    out, n = [], rank + 1
    while n:
        n, r = divmod(n, len(syllables))
        out.append(syllables[r])
    return "".join(out)


def _sentence(rng: np.random.Generator, low: int, high: int) -> str:
    ranks = np.minimum(rng.zipf(1.3, size=int(rng.integers(low, high))), _VOCABULARY) - 1
    return " ".join(_word(int(r)) for r in ranks).capitalize() + "."


def synthetic_memories(n: int, seed: int = 0) -> list[Candidate]:
    """n chat turns in sessions of consecutive turns, one session every few days."""
    rng = np.random.default_rng(seed)
    start = datetime(2023, 1, 1, 10, 0, tzinfo=UTC)
    out: list[Candidate] = []
    for i in range(n):
        session, turn = divmod(i, _TURNS_PER_SESSION)
        out.append(
            Candidate(
                item_id=f"m{i}",
                layer=Layer.MEMORY,
                category="conversation",
                text=_sentence(rng, 6, 45),
                confidence=1.0,
                provenance=Provenance.EXPLICIT,
                evidence=(f"ev{i}",),
                source_refs=(f"D{session + 1}:{turn + 1}",),
                occurred_at=start + timedelta(days=3 * session, seconds=turn),
                actor=_SPEAKERS[i % 2],
            )
        )
    return out


def _unit_rows(rng: np.random.Generator, n: int, dim: int = 384) -> np.ndarray:
    matrix = rng.standard_normal((n, dim)).astype(np.float32)
    unit: np.ndarray = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    return unit


def _time_queries(
    index: MemoryIndex,
    queries: Sequence[str],
    vectors: np.ndarray | None,
    budget: int,
    counter: TiktokenCounter,
    now: datetime,
) -> dict[str, Any]:
    timings: list[float] = []
    tokens: list[int] = []
    for i, query in enumerate(queries):
        started = time.perf_counter()
        packed = build_slice(
            query=query,
            attributes=(),
            intents=(),
            memory_index=index,
            budget_tokens=budget,
            counter=counter,
            query_vector=None if vectors is None else vectors[i],
            now=now,
        )
        timings.append((time.perf_counter() - started) * 1000.0)
        tokens.append(packed.n_tokens)
        if packed.n_tokens > budget:
            raise AssertionError(f"slice of {packed.n_tokens} tokens over budget {budget}")
    q = statistics.quantiles(timings, n=20)
    return {
        "p50_ms": round(statistics.median(timings), 3),
        "p95_ms": round(q[18], 3),
        "mean_tokens": round(statistics.fmean(tokens), 1),
    }


def run(memories: int, queries: int, budgets: Sequence[int], seed: int) -> dict[str, Any]:
    """Index a synthetic subject once, then time build_slice per mode and budget."""
    counter = TiktokenCounter()
    rng = np.random.default_rng(seed + 1)
    candidates = synthetic_memories(memories, seed)
    vectors = _unit_rows(rng, memories)
    started = time.perf_counter()
    hybrid = MemoryIndex.build(candidates, vectors, counter)
    build_ms = (time.perf_counter() - started) * 1000.0
    lexical = MemoryIndex.build(candidates, None, counter)
    texts = [_sentence(rng, 5, 12).rstrip(".") + "?" for _ in range(queries)]
    query_vectors = _unit_rows(rng, queries)
    last = candidates[-1].occurred_at
    assert last is not None  # synthetic_memories dates every turn
    now = last + timedelta(days=1)
    warm = min(20, queries)
    _time_queries(hybrid, texts[:warm], query_vectors, budgets[0], counter, now)
    _time_queries(lexical, texts[:warm], None, budgets[0], counter, now)
    results: dict[str, Any] = {}
    for budget in budgets:
        results[str(budget)] = {
            "hybrid": _time_queries(hybrid, texts, query_vectors, budget, counter, now),
            "lexical_only": _time_queries(lexical, texts, None, budget, counter, now),
        }
    return {
        "benchmark": "retrieval_build_slice",
        "memories": memories,
        "queries": queries,
        "seed": seed,
        "index_build_ms": round(build_ms, 1),
        "excludes": "the query embedding (computed once by the caller)",
        "results": results,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.retrieval_bench")
    parser.add_argument("--memories", type=int, default=5000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--budgets", type=lambda s: [int(x) for x in s.split(",")], default=[1024])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    report = run(args.memories, args.queries, args.budgets, args.seed)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
