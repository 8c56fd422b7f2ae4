"""Reciprocal rank fusion of the lexical and dense rankings (``SliceOptions.fusion``)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest

from tests.retrieval.factories import NOW, T0, memory
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import MemoryIndex, SliceOptions
from uprof.retrieval.ranker import analyse_query, memory_relevance

COUNTER = TiktokenCounter()
PLAIN = SliceOptions(recency_weight=0.0, heat_weight=0.0, actor_weight=0.0)
RRF = replace(PLAIN, fusion="rrf", rrf_k=60.0)


def _unit(*weights: float) -> np.ndarray:
    v = np.zeros(4, dtype=np.float32)
    v[: len(weights)] = weights
    return v / np.linalg.norm(v)


def _case() -> tuple[MemoryIndex, np.ndarray]:
    texts = [
        "The marathon in Boston was hard.",  # m0: the only word match, far in meaning
        "I ran my first long race last spring.",  # m1: closest in meaning
        "Training runs every morning before work.",  # m2: second in meaning
        "My cat sleeps all day.",  # m3: unrelated
    ]
    memories = [
        memory(f"m{i}", t, at=T0 + timedelta(days=i), actor="Sam") for i, t in enumerate(texts)
    ]
    vectors = np.stack([_unit(0.2, 1.0), _unit(1.0, 0.1), _unit(0.9, 0.5), _unit(0.0, 0.0, 1.0)])
    return MemoryIndex.build(memories, vectors, COUNTER), _unit(1.0)


def test_rrf_scores_are_the_weighted_reciprocal_ranks_of_both_signals() -> None:
    index, query_vector = _case()
    query = analyse_query("How was the marathon?")
    fused, weight, _ = memory_relevance(index, query, query_vector, NOW, RRF)
    k = 61.0  # rrf_k + 1: rank 1 scores 1
    # m0: lexical rank 1, dense rank 3; m1: no word match, dense rank 1; m2: dense rank 2.
    expected = [
        weight * 1.0 + (1 - weight) * k / (60 + 3),
        (1 - weight) * k / (60 + 1),
        (1 - weight) * k / (60 + 2),
        (1 - weight) * k / (60 + 4),
    ]
    assert weight == PLAIN.lexical_weight
    assert fused.tolist() == pytest.approx(expected, rel=1e-6)


def test_rrf_ignores_score_gaps_that_score_fusion_keeps() -> None:
    index, query_vector = _case()
    query = analyse_query("How was the marathon?")
    by_score, *_ = memory_relevance(index, query, query_vector, NOW, PLAIN)
    by_rank, *_ = memory_relevance(index, query, query_vector, NOW, RRF)
    # Score fusion gives the unrelated m3 (cosine 0, below the median) no dense credit;
    # rank fusion gives it its rank's share, a fixed step below m2.
    assert by_score[3] == pytest.approx(0.0, abs=1e-6)
    assert by_rank[3] > 0.0
    assert by_rank[2] > by_rank[3]


def test_without_a_word_match_rrf_falls_back_to_the_dense_score() -> None:
    index, query_vector = _case()
    query = analyse_query("Anything about jogging?")  # no BM25 match at all
    by_score, w_score, _ = memory_relevance(index, query, query_vector, NOW, PLAIN)
    by_rank, w_rank, _ = memory_relevance(index, query, query_vector, NOW, RRF)
    assert w_score == w_rank == 0.0
    assert by_rank.tolist() == pytest.approx(by_score.tolist())
