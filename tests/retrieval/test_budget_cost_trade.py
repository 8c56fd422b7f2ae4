"""The packer's budget-dependent cost trade (retrieval round 20).

Round 19's trade (choices compete on gain / tokens ** (a * (1 - utility))) applies only
while the budget holds fewer than ``cost_lines`` of the pool's lines, counted as the budget
over the median own-line cost of the ``cost_top_k`` most useful choices. Off by default
(a = 0 is decision 0020's rank-order first-fit); these tests hold what the knobs do when
set, and that they stay off unless asked for.
"""

from __future__ import annotations

import math
from dataclasses import replace
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.retrieval.factories import NOW, memory
from uprof.adapters.embeddings import HashingEmbedder
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import MemoryIndex, SliceOptions, build_slice, builder
from uprof.retrieval.packer import PackProblem, budget_lines, pack, trade_exponent

EMBEDDER = HashingEmbedder()
COUNTER = TiktokenCounter()


def _problem(
    costs: list[int],
    utility: list[float],
    budget: int,
    a: float,
    lines: float = math.inf,
    top_k: int = 10,
) -> PackProblem:
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
        cost_lines=lines,
        cost_top_k=top_k,
    )


def test_off_by_default_in_the_options_and_the_problem() -> None:
    from uprof.services.slices import SLICE_OPTIONS

    for options in (SliceOptions(), SLICE_OPTIONS):
        assert options.cost_exponent == 0.0
        assert options.cost_lines == math.inf
    # Off, a weak long item is taken before a slightly weaker short one (rank order).
    assert pack(_problem([60, 10], [0.3, 0.25], budget=60, a=0.0)).chosen == (0,)
    assert pack(_problem([60, 10], [0.3, 0.25], budget=60, a=0.0, lines=100.0)).chosen == (0,)


def test_the_lines_are_the_budget_over_the_median_cost_of_the_most_useful_choices() -> None:
    # Top 3 by utility cost 40, 20 and 30 (median 30); the cheap weak ones do not count.
    problem = _problem([20, 5, 40, 5, 30], [0.8, 0.1, 1.0, 0.05, 0.6], budget=120, a=1, top_k=3)
    assert budget_lines(problem) == pytest.approx(120 / 30)
    # Every choice counted (k beyond the pool): median of 5, 5, 20, 30, 40.
    assert budget_lines(replace(problem, cost_top_k=50)) == pytest.approx(120 / 20)
    assert budget_lines(_problem([], [], budget=100, a=1)) == math.inf


def test_the_trade_applies_only_below_the_lines() -> None:
    # Budget 60 over a median cost of 35: 1.7 lines. Below cost_lines the weak long item
    # pays for its length (0.3 / 60^0.7 = 0.017 against 0.25 / 10^0.75 = 0.044) and the
    # short one goes first; at or above, it is rank order again.
    below = _problem([60, 10], [0.3, 0.25], budget=60, a=1.0, lines=2.0)
    assert trade_exponent(below) == 1.0
    assert pack(below).chosen == (1,)
    above = replace(below, cost_lines=1.5)
    assert trade_exponent(above) == 0.0
    assert pack(above).chosen == (0,)
    assert pack(replace(below, cost_lines=math.inf)).chosen == (1,)  # round 19's trade


def test_a_budget_that_holds_many_lines_pays_no_cost() -> None:
    # Twelve weak 60-token lines and twelve slightly weaker 10-token ones. At 120 tokens
    # (2 of the top lines) the trade takes short lines; at 600 (10 lines) it is rank order.
    costs = [60] * 12 + [10] * 12
    utility = [1.0] + [0.3] * 11 + [0.25] * 12
    small = _problem(costs, utility, budget=120, a=1.0, lines=4.0)
    large = replace(small, budget=600)
    assert budget_lines(small) == pytest.approx(2.0)
    assert budget_lines(large) == pytest.approx(10.0)
    assert pack(small).chosen[0] == 0
    assert set(pack(small).chosen[1:]) <= set(range(12, 24))
    assert pack(large).chosen == pack(replace(large, cost_exponent=0.0)).chosen


def test_the_top_item_is_taken_whatever_its_length() -> None:
    # Decision 0020's case (one answer at 1.0 and 71 tokens, eight lines at 0.25 and 10):
    # at the top the cost's exponent is 0, so even a steep trade keeps the answer.
    costs = [71] + [10] * 8
    utility = [1.0] + [0.25] * 8
    result = pack(_problem(costs, utility, budget=100, a=2.0, lines=50.0))
    assert result.chosen[0] == 0
    assert result.spent <= 100


@pytest.mark.parametrize(
    ("knob", "bad"),
    [
        ("cost_exponent", -0.5),
        ("cost_exponent", math.nan),
        ("cost_exponent", math.inf),
        ("cost_lines", 0.0),
        ("cost_lines", -2.0),
        ("cost_lines", math.nan),
        ("cost_top_k", 0),
        ("cost_top_k", 2.5),
        ("cost_top_k", True),
    ],
)
def test_a_bad_knob_is_refused_by_name(knob: str, bad: float) -> None:
    with pytest.raises(ValueError, match=knob):
        replace(_problem([5], [1.0], budget=10, a=0.5), **{knob: bad})


def test_build_slice_refuses_a_bad_knob_by_name() -> None:
    memories = [memory("m1", "Caroline paints sunrises over the lake")]
    index = MemoryIndex.build(memories, EMBEDDER.embed([m.text for m in memories]), COUNTER)
    with pytest.raises(ValueError, match="cost_lines"):
        build_slice(
            query="what does Caroline paint?",
            attributes=[],
            intents=[],
            memory_index=index,
            budget_tokens=100,
            counter=COUNTER,
            query_vector=EMBEDDER.embed(["what does Caroline paint?"])[0],
            now=NOW,
            options=SliceOptions(cost_exponent=0.5, cost_lines=-1.0),
        )


def test_build_slice_hands_the_knobs_to_the_packer_and_keeps_the_budget() -> None:
    texts = [
        "Caroline paints sunrises over the lake every weekend with her kids",
        "yes",
        "Caroline went camping in Sweden and painted the pottery she made there by hand",
        "lol",
        "Melanie joined a support group for adoption last spring and loved it",
    ]
    memories = [memory(f"m{i}", t) for i, t in enumerate(texts)]
    index = MemoryIndex.build(memories, EMBEDDER.embed(texts), COUNTER)
    seen: list[tuple[float, float, int]] = []
    original = builder.pack

    def spy(problem: PackProblem) -> object:
        seen.append((problem.cost_exponent, problem.cost_lines, problem.cost_top_k))
        return original(problem)

    query = "what does Caroline paint?"
    for a, lines, k in ((0.0, math.inf, 10), (0.5, 6.0, 3)):
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
                options=SliceOptions(cost_exponent=a, cost_lines=lines, cost_top_k=k),
            )
        assert packed.n_tokens == COUNTER.count(packed.text) <= 40
    assert seen == [(0.0, math.inf, 10), (0.5, 6.0, 3)]


_items = st.lists(
    st.tuples(st.integers(1, 60), st.floats(0.0, 1.0, allow_nan=False)), min_size=1, max_size=25
)


@settings(max_examples=300, deadline=None)
@given(
    items=_items,
    budget=st.integers(0, 300),
    a=st.floats(0.0, 3.0),
    lines=st.floats(0.5, 20.0),
    top_k=st.integers(1, 30),
)
def test_the_packing_is_round_19s_below_the_lines_and_rank_order_from_there(
    items: list[tuple[int, float]], budget: int, a: float, lines: float, top_k: int
) -> None:
    costs = [c for c, _ in items]
    utility = [u for _, u in items]
    problem = _problem(costs, utility, budget, a, lines, top_k)
    result = pack(problem)
    assert result.spent == sum(costs[j] for j in result.chosen) <= budget
    held = budget_lines(problem)
    full = pack(replace(problem, cost_lines=math.inf))  # round 19's trade, at every budget
    off = pack(replace(problem, cost_exponent=0.0))  # rank order (decision 0020)
    assert result.chosen == (full.chosen if held < lines else off.chosen)
    # The trade's guarantee where it applies (keys fixed without overheads or similarity):
    # an item left out did not fit beside the chosen items whose key is at least its own.
    e = trade_exponent(problem)
    key = [u / c ** (e * (1 - u)) for c, u in items]
    chosen = set(result.chosen)
    for j in range(len(items)):
        if j in chosen or utility[j] <= 0:
            continue
        better = [i for i in chosen if key[i] >= key[j]]
        assert sum(costs[i] for i in better) + costs[j] > budget
