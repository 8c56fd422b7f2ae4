"""Marginal relevance counted from a similarity floor (``SliceOptions.mmr_floor``, round 15).

The diagnosed failure (retrieval round 15, tune half): a multi-hop question's evidence turns
are topic-mates (MiniLM cosine 0.49-0.75 to a chosen turn, against 0.20-0.27 between two
memories of the subject on average); marginal relevance discounts them for that likeness
and the budget goes to weaker turns on other topics."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.retrieval.factories import NOW, T0, memory
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import MemoryIndex, SliceOptions, build_slice, builder
from uprof.retrieval.packer import PackProblem, _Packing, pack
from uprof.retrieval.ranker import PoolSimilarity, mean_pairwise

COUNTER = TiktokenCounter()

#: A chosen answer (0), its topic-mate (1, cosine 0.5 to it) and a weaker memory on
#: another topic (2, cosine 0.1); room for two.
_SIM = np.array([[0.0, 0.5, 0.1], [0.5, 0.0, 0.1], [0.1, 0.1, 0.0]])


def _problem(floor: float, utility: tuple[float, ...] = (1.0, 0.6, 0.5)) -> PackProblem:
    return PackProblem(
        costs=np.asarray([10, 10, 10]),
        utility=np.asarray(utility),
        owner=np.arange(3),
        groups=np.full((3, 1), -1),
        group_costs=np.zeros(0, dtype=np.int64),
        similar_to=lambda j: _SIM[:, j],
        budget=20,
        similarity_floor=floor,
    )


def test_held_raw_marginal_relevance_drops_the_topic_mate_for_a_weaker_other_topic() -> None:
    # main's packer: 0.6 * (1 - 0.5 * 0.5) = 0.45 < 0.5 * (1 - 0.5 * 0.1) = 0.475.
    assert sorted(pack(_problem(0.0)).chosen) == [0, 2]


def test_from_a_floor_the_topic_mate_keeps_more_than_the_weaker_memory() -> None:
    # (0.5 - 0.3) / 0.7 = 0.29: 0.6 * (1 - 0.5 * 0.29) = 0.51 > 0.5.
    assert sorted(pack(_problem(0.3)).chosen) == [0, 1]


def test_a_near_repeat_is_still_discounted_and_a_duplicate_still_skipped() -> None:
    # 1 nearly repeats 0 (0.9), 2 duplicates it (0.96), 3 is weaker and on another topic.
    sim = np.array(
        [[0.0, 0.9, 0.96, 0.1], [0.9, 0.0, 0.1, 0.1], [0.96, 0.1, 0.0, 0.1], [0.1, 0.1, 0.1, 0.0]]
    )
    problem = PackProblem(
        costs=np.full(4, 10),
        utility=np.asarray([1.0, 0.7, 0.9, 0.45]),
        owner=np.arange(4),
        groups=np.full((4, 1), -1),
        group_costs=np.zeros(0, dtype=np.int64),
        similar_to=lambda j: sim[:, j],
        budget=20,
        similarity_floor=0.3,
    )
    result = pack(problem)
    # 0.7 * (1 - 0.5 * (0.9 - 0.3) / 0.7) = 0.40 < 0.45: the repeat loses to the weaker one.
    assert sorted(result.chosen) == [0, 3]
    assert result.duplicate_of == {2: 0}


@settings(max_examples=60, deadline=None)
@given(
    utility=st.lists(st.floats(0.01, 1.0), min_size=2, max_size=8),
    seed=st.integers(0, 2**16),
    floor=st.floats(0.0, 0.9),
)
def test_a_floor_never_discounts_more_than_raw_similarity(
    utility: list[float], seed: int, floor: float
) -> None:
    m = len(utility)
    sims = np.random.default_rng(seed).uniform(-0.2, 1.0, size=(m, m))
    sims = (sims + sims.T) / 2
    np.fill_diagonal(sims, 0.0)
    base = PackProblem(
        costs=np.full(m, 5),
        utility=np.asarray(utility),
        owner=np.arange(m),
        groups=np.full((m, 1), -1),
        group_costs=np.zeros(0, dtype=np.int64),
        similar_to=lambda j: sims[:, j],
        budget=5 * m,
    )
    raw, floored = _Packing(base), _Packing(replace(base, similarity_floor=floor))
    for j in np.random.default_rng(seed + 1).permutation(m)[: m // 2].tolist():
        raw.take(j)
        floored.take(j)
        # Never more discount than raw similarity, never more than the penalty, and an
        # item no more alike than the floor keeps its whole utility.
        assert np.all(floored.gains() >= raw.gains() - 1e-12)
        assert np.all(floored.gains() >= 0.5 * base.utility - 1e-12)
        at_most_floor = floored.max_sim <= floor
        assert np.allclose(floored.gains()[at_most_floor], base.utility[at_most_floor])


def _index(n: int = 12, with_vectors: bool = True) -> MemoryIndex:
    rng = np.random.default_rng(11)
    vectors = rng.normal(size=(n, 16)).astype(np.float32) + 0.8
    memories = [
        memory(
            f"m{i}",
            f"turn {i} about hiking and the {['lake', 'city', 'dog'][i % 3]}",
            at=T0 + timedelta(days=i),
        )
        for i in range(n)
    ]
    return MemoryIndex.build(memories, vectors if with_vectors else None, COUNTER)


@pytest.mark.parametrize("with_vectors", [True, False])
def test_the_pools_mean_pairwise_similarity_is_the_mean_over_its_pairs(
    with_vectors: bool,
) -> None:
    index = _index(with_vectors=with_vectors)
    rows = np.asarray([5, 2, 9, 0, 7, 3])
    pool = PoolSimilarity(index, rows)
    for members in (0, 2, 4, 6, 50):
        k = len(rows) if members in (0, 50) else members
        full = np.stack([pool.column(j) for j in range(k)], axis=1)[:k]
        expected = full[~np.eye(k, dtype=bool)].mean()
        assert pool.mean_pairwise(members) == pytest.approx(expected, abs=1e-6)
    assert PoolSimilarity(index, rows[:1]).mean_pairwise() == 0.0


def test_the_subjects_mean_pairwise_cosine_is_the_mean_over_its_pairs() -> None:
    index = _index()
    assert index.vectors is not None
    v = index.vectors.astype(np.float64)
    cos = v @ v.T
    assert mean_pairwise(index) == pytest.approx(cos[~np.eye(len(v), dtype=bool)].mean())
    assert mean_pairwise(_index(with_vectors=False)) == 0.0


@pytest.mark.parametrize("mode", ["off", "subject", "pool"])
def test_build_slice_hands_the_packer_the_floor_its_options_name(mode: str) -> None:
    index = _index()
    seen: list[PackProblem] = []

    def spy(problem: PackProblem) -> Any:
        seen.append(problem)
        return pack(problem)

    query_vector = np.ones(16, dtype=np.float32) / 4
    options = replace(SliceOptions(), mmr_floor=mode, mmr_floor_members=4)  # type: ignore[arg-type]
    with patch.object(builder, "pack", spy):
        build_slice(
            query="hiking by the lake",
            attributes=[],
            intents=[],
            memory_index=index,
            budget_tokens=200,
            counter=COUNTER,
            query_vector=query_vector,
            now=NOW,
            options=options,
        )
    floor = seen[0].similarity_floor
    if mode == "off":
        assert floor == 0.0
    elif mode == "subject":
        assert floor == pytest.approx(mean_pairwise(index)) and floor > 0
    else:
        assert 0 < floor and floor != pytest.approx(mean_pairwise(index))
