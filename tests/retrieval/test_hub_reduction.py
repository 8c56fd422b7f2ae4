"""Hubness reduction of the dense score (decision 0093-retrieval-round-7): off by default.

A tiny fixed subject: a "hub" memory that leans towards every topic a little, the memory
the query is about, and four others sharing the subject's generic direction (axis 0). The
plain cosine ranks the hub first; each reduction ranks the specific memory first.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest

from tests.retrieval.factories import NOW, T0, memory
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import MemoryIndex, SliceOptions
from uprof.retrieval.ranker import analyse_query, rank_memories

COUNTER = TiktokenCounter()
DIM = 8


def _unit(*weights: float) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[: len(weights)] = weights
    return v / np.linalg.norm(v)


HUB = _unit(1.0, 0.3, 0.3, 0.3, 0.3, 0.3)
TARGET = _unit(0.6, 1.0)
OTHERS = [_unit(1.0, 0.0, *([0.0] * k), 0.8) for k in range(4)]
QUERY = _unit(1.0, 0.45)
#: Only the dense score moves the ranking: no words shared, no bonuses, no bridges.
PLAIN = SliceOptions(
    bridge_weight=0.0, neighbour_weight=0.0, recency_weight=0.0, heat_weight=0.0, mmr_penalty=0.0
)


def _index() -> MemoryIndex:
    vectors = np.stack([HUB, TARGET, *OTHERS])
    memories = [
        memory(f"m{i}", f"note {i}", at=T0 + timedelta(days=i)) for i in range(len(vectors))
    ]
    return MemoryIndex.build(memories, vectors, COUNTER)


def _ranked(index: MemoryIndex, options: SliceOptions) -> list[str]:
    ranking = rank_memories(index, analyse_query("what would I enjoy"), QUERY, NOW, options)
    return [index.candidates[r].item_id for r in ranking.rows]


def test_hub_reduction_is_off_by_default() -> None:
    defaults = SliceOptions()
    assert (defaults.centring, defaults.query_centring, defaults.hub_penalty) == (0, 0, 0)
    assert _ranked(_index(), PLAIN)[0] == "m0"  # the plain cosine puts the hub first


@pytest.mark.parametrize("knob", [{"centring": 1.0}, {"query_centring": 1.0}, {"hub_penalty": 0.5}])
def test_each_reduction_ranks_the_specific_memory_above_the_hub(knob: dict[str, float]) -> None:
    ranked = _ranked(_index(), replace(PLAIN, **knob))
    assert ranked[0] == "m1"


def test_hub_scores_are_the_mean_cosine_to_the_nearest_other_memories() -> None:
    index = _index()
    assert index.vectors is not None
    sims = index.vectors @ index.vectors.T
    np.fill_diagonal(sims, -np.inf)
    expected = np.sort(sims, axis=1)[:, -2:].mean(axis=1)
    np.testing.assert_allclose(index.hub_scores(2), expected, rtol=1e-6)
    assert index.hub_scores(2) is index.hub_scores(2)  # computed once per index


def test_centred_vectors_are_unit_rows_of_the_memories_minus_their_mean() -> None:
    index = _index()
    assert index.vectors is not None
    centred = index.centred_vectors(1.0)
    raw = index.vectors - index.vectors.mean(axis=0)
    np.testing.assert_allclose(
        centred, raw / np.linalg.norm(raw, axis=1, keepdims=True), rtol=1e-5, atol=1e-6
    )
    assert index.centred_vectors(1.0) is centred


def test_a_single_memory_has_no_hub_score() -> None:
    index = MemoryIndex.build([memory("m0", "only one")], HUB[None, :], COUNTER)
    assert index.hub_scores(10).tolist() == [0.0]
