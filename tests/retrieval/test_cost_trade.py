"""The packer's cost trade (retrieval round 19): gain / tokens ** (a * (1 - utility)).

Off by default (a = 0 is decision 0020's rank-order first-fit); these tests hold what the
knob does when it is set, and that it stays off unless asked for.
"""

from __future__ import annotations

import math
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.retrieval.factories import NOW, memory
from uprof.adapters.embeddings import HashingEmbedder
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import MemoryIndex, SliceOptions, build_slice, builder
from uprof.retrieval.packer import PackProblem, pack

EMBEDDER = HashingEmbedder()
COUNTER = TiktokenCounter()


def _problem(costs: list[int], utility: list[float], budget: int, a: float) -> PackProblem:
    m = len(costs)
    return PackProblem(
        costs=np.asarray(costs),
        utility=np.asarray(utility, dtype=float),
        owner=np.arange(m),
        groups=np.full((m, 1), -1),
        group_costs=np.zeros(0, dtype=np.int64),
        similar_to=None,
        budget=budget,
        cost_exponent=a,
    )


def test_off_by_default_in_the_options_and_the_problem() -> None:
    assert SliceOptions().cost_exponent == 0.0
    from uprof.services.slices import SLICE_OPTIONS

    assert SLICE_OPTIONS.cost_exponent == 0.0
    # Off, a weak long item is taken before a slightly weaker short one (rank order).
    assert pack(_problem([60, 10], [0.3, 0.25], budget=60, a=0.0)).chosen == (0,)


def test_a_weak_long_item_pays_for_its_length() -> None:
    # 0.3 at 60 tokens against 0.25 at 10: keys 0.3 / 60^0.7 = 0.017 and
    # 0.25 / 10^0.75 = 0.044, so the short one goes first and the long one no longer fits.
    result = pack(_problem([60, 10], [0.3, 0.25], budget=60, a=1.0))
    assert result.chosen == (1,)
    assert result.spent == 10


def test_the_top_item_is_taken_whatever_its_length() -> None:
    # Decision 0020's case (one answer at 1.0 and 71 tokens, eight lines at 0.25 and 10):
    # at the top the cost's exponent is 0, so even a steep trade keeps the answer.
    costs = [71] + [10] * 8
    utility = [1.0] + [0.25] * 8
    result = pack(_problem(costs, utility, budget=100, a=2.0))
    assert result.chosen[0] == 0
    assert result.spent <= 100


@pytest.mark.parametrize("bad", [-0.5, math.nan, math.inf])
def test_a_bad_exponent_is_refused_by_name(bad: float) -> None:
    with pytest.raises(ValueError, match="cost_exponent"):
        _problem([5], [1.0], budget=10, a=bad)


def test_build_slice_refuses_a_bad_exponent_by_name() -> None:
    memories = [memory("m1", "Caroline paints sunrises over the lake")]
    index = MemoryIndex.build(memories, EMBEDDER.embed([m.text for m in memories]), COUNTER)
    with pytest.raises(ValueError, match="cost_exponent"):
        build_slice(
            query="what does Caroline paint?",
            attributes=[],
            intents=[],
            memory_index=index,
            budget_tokens=100,
            counter=COUNTER,
            query_vector=EMBEDDER.embed(["what does Caroline paint?"])[0],
            now=NOW,
            options=SliceOptions(cost_exponent=-1.0),
        )


def test_build_slice_hands_the_exponent_to_the_packer_and_keeps_the_budget() -> None:
    texts = [
        "Caroline paints sunrises over the lake every weekend with her kids",
        "yes",
        "Caroline went camping in Sweden and painted the pottery she made there by hand",
        "lol",
        "Melanie joined a support group for adoption last spring and loved it",
    ]
    memories = [memory(f"m{i}", t) for i, t in enumerate(texts)]
    index = MemoryIndex.build(memories, EMBEDDER.embed(texts), COUNTER)
    seen: list[float] = []
    original = builder.pack

    def spy(problem: PackProblem) -> object:
        seen.append(problem.cost_exponent)
        return original(problem)

    query = "what does Caroline paint?"
    for a in (0.0, 0.5):
        with patch.object(builder, "pack", spy):
            packed = build_slice(
                query=query,
                attributes=[],
                intents=[],
                memory_index=index,
                budget_tokens=40,
                counter=COUNTER,
                query_vector=EMBEDDER.embed([query])[0],
                now=NOW,
                options=SliceOptions(cost_exponent=a),
            )
        assert packed.n_tokens == COUNTER.count(packed.text) <= 40
    assert seen == [0.0, 0.5]


_items = st.lists(
    st.tuples(st.integers(1, 60), st.floats(0.0, 1.0, allow_nan=False)), min_size=1, max_size=25
)


@settings(max_examples=300, deadline=None)
@given(items=_items, budget=st.integers(0, 300), a=st.floats(0.0, 3.0))
def test_never_over_budget_and_left_out_only_beside_items_worth_more_per_token(
    items: list[tuple[int, float]], budget: int, a: float
) -> None:
    costs = [c for c, _ in items]
    utility = [u for _, u in items]
    result = pack(_problem(costs, utility, budget, a))
    chosen = set(result.chosen)
    assert result.spent == sum(costs[j] for j in chosen) <= budget
    # Without overheads or similarity the keys are fixed: an item left out did not fit
    # beside the chosen items whose key is at least its own (the trade's guarantee,
    # 0020's with the key in place of the utility).
    key = [u / c ** (a * (1 - u)) for c, u in items]
    for j in range(len(items)):
        if j in chosen or utility[j] <= 0:
            continue
        better = [i for i in chosen if key[i] >= key[j]]
        assert sum(costs[i] for i in better) + costs[j] > budget
