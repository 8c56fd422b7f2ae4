"""Spread over days (``SliceOptions.day_spread``): one day's turns do not crowd out others."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.retrieval.factories import NOW, T0, memory
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import MemoryIndex, SliceOptions, build_slice
from uprof.retrieval.packer import PackProblem, pack

COUNTER = TiktokenCounter()


def _problem(utility: list[float], day: list[int], budget: int, **spread: object) -> PackProblem:
    m = len(utility)
    return PackProblem(
        costs=np.full(m, 10),
        utility=np.asarray(utility, dtype=float),
        owner=np.arange(m),
        groups=np.full((m, 1), -1),
        group_costs=np.zeros(0, dtype=np.int64),
        similar_to=None,
        budget=budget,
        day=np.asarray(day),
        **spread,  # type: ignore[arg-type]
    )


# Day 0 holds the three best choices, day 1 one a little weaker; room for three.
UTILITY, DAY = [1.0, 0.9, 0.8, 0.6], [0, 0, 0, 1]


def test_off_packs_in_rank_order() -> None:
    assert pack(_problem(UTILITY, DAY, budget=30)).chosen == (0, 1, 2)


def test_a_crowded_day_yields_to_another_days_choice() -> None:
    # After 0, choice 1 is worth 0.9 / 2 = 0.45 beside day 1's 0.6.
    assert pack(_problem(UTILITY, DAY, budget=30, day_spread=1.0)).chosen == (0, 3, 1)


def test_free_choices_per_day_are_not_discounted() -> None:
    result = pack(_problem(UTILITY, DAY, budget=30, day_spread=1.0, day_spread_free=2))
    assert result.chosen == (0, 1, 2)
    result = pack(_problem(UTILITY, DAY, budget=30, day_spread=1.0, day_spread_free=1))
    assert result.chosen == (0, 1, 3)  # choice 2 is the second past the free one: 0.4


def test_undated_choices_are_never_discounted() -> None:
    # A profile line (day -1) at 0.5 is not lowered by the memories taken before it.
    result = pack(_problem([1.0, 0.9, 0.5], [0, 0, -1], budget=20, day_spread=1.0))
    assert result.chosen == (0, 2)


def test_balance_lifts_an_unseen_day_above_the_mean() -> None:
    # Balanced, day 1 (no choice yet) is worth 0.6 * (1 + 1) against day 0's 0.9 * 2 / 2.
    result = pack(_problem(UTILITY, DAY, budget=20, day_spread=1.0, day_spread_balance=True))
    assert result.chosen == (0, 3)


@settings(max_examples=60, deadline=None)
@given(
    utility=st.lists(st.floats(0.01, 1.0), min_size=1, max_size=25),
    lines=st.integers(0, 5),
    budget=st.integers(0, 200),
    spread=st.floats(0.1, 3.0),
    free=st.integers(0, 3),
)
def test_balance_leaves_a_single_day_subject_as_it_was(
    utility: list[float], lines: int, budget: int, spread: float, free: int
) -> None:
    # PrefEval's subjects hold every memory on one day: the balanced spread must not move
    # their memories against each other nor against the (undated) profile lines.
    day = [0] * len(utility) + [-1] * lines
    utility = utility + [0.3] * lines
    off = pack(_problem(utility, day, budget))
    on = pack(
        _problem(
            utility, day, budget, day_spread=spread, day_spread_free=free, day_spread_balance=True
        )
    )
    assert on.chosen == off.chosen


def _two_days() -> tuple[MemoryIndex, np.ndarray]:
    texts = [
        ("a0", "We hiked the ridge trail on Saturday.", 0),
        ("a1", "The ridge trail hike took us six hours.", 0),
        ("a2", "After the hike we camped by the lake.", 0),
        ("b0", "I signed up for a pottery class downtown.", 9),
        ("c0", "The printer is out of toner again.", 20),
        ("c1", "Traffic was bad this morning.", 21),
        ("c2", "We need more milk.", 22),
        ("c3", "The meeting moved to Tuesday.", 23),
    ]
    memories = [
        memory(item, text, at=T0 + timedelta(days=d, minutes=i), actor="Sam")
        for i, (item, text, d) in enumerate(texts)
    ]
    vectors = np.eye(len(texts), dtype=np.float32)
    query = np.asarray([1.0, 0.95, 0.9, 0.85, 0, 0, 0, 0], dtype=np.float32)
    return MemoryIndex.build(memories, vectors, COUNTER), query / np.linalg.norm(query)


def test_build_slice_spreads_memories_over_days() -> None:
    # Dense only, no neighbour flow or bridges: relevance follows the query vector, so
    # the ranking is a0 > a1 > a2 > b0 (utilities 1, 0.76, 0.56, 0.40 after sharpening).
    index, query_vector = _two_days()
    plain = SliceOptions(
        lexical_weight=0.0,
        neighbour_weight=0.0,
        bridge_weight=0.0,
        actor_weight=0.0,
        recency_weight=0.0,
        heat_weight=0.0,
        mmr_penalty=0.0,
        max_items=3,
    )

    def packed(options: SliceOptions) -> list[str]:
        result = build_slice(
            query="What did Sam do?",
            attributes=[],
            intents=[],
            memory_index=index,
            budget_tokens=1000,
            counter=COUNTER,
            query_vector=query_vector,
            now=NOW,
            options=options,
        )
        return sorted(c.item_id for c in result.items)

    assert packed(plain) == ["a0", "a1", "a2"]
    # Spread: a1 is worth 0.76 / 2 once a0 is taken, below b0's 0.40 from another day.
    assert packed(replace(plain, day_spread=1.0)) == ["a0", "a1", "b0"]
