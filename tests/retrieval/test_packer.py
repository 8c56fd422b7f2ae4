"""The budgeted selection on its own."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from uprof.retrieval.packer import PackProblem, pack


def _problem(costs: list[int], utility: list[float], budget: int, **kw: object) -> PackProblem:
    m = len(costs)
    return PackProblem(
        costs=np.asarray(costs),
        utility=np.asarray(utility, dtype=float),
        owner=np.asarray(kw.pop("owner", list(range(m)))),  # type: ignore[arg-type]
        groups=np.asarray(kw.pop("groups", [[-1]] * m)),  # type: ignore[arg-type]
        group_costs=np.asarray(kw.pop("group_costs", []), dtype=np.int64),  # type: ignore[arg-type]
        similar_to=kw.pop("similar_to", None),  # type: ignore[arg-type]
        budget=budget,
        max_chosen=kw.pop("max_chosen", None),  # type: ignore[arg-type]
    )


def test_fix_up_beats_plain_ratio_greedy() -> None:
    # Ratio greedy takes the two cheap items (ratio 0.5) and then cannot fit the big one
    # (ratio 0.45); the big one alone is worth more than both cheap ones together.
    result = pack(_problem([10, 10, 100], [5.0, 5.0, 45.0], budget=105))
    assert result.chosen == (2,)


def test_at_most_max_chosen_are_taken_the_most_relevant_first() -> None:
    # Room for all five, but a slice may list only three (its read's audit entry).
    result = pack(_problem([5] * 5, [0.2, 0.9, 0.5, 0.8, 0.1], budget=100, max_chosen=3))
    assert sorted(result.chosen) == [1, 2, 3]


def test_overheads_are_paid_once_and_counted() -> None:
    result = pack(
        _problem([5, 5, 5], [1.0, 1.0, 1.0], budget=21, groups=[[0], [0], [1]], group_costs=[6, 6])
    )
    assert sorted(result.chosen) == [0, 1]
    assert result.spent == 16


def test_alternatives_of_one_owner_are_exclusive() -> None:
    result = pack(_problem([20, 8], [1.0, 0.6], budget=100, owner=[0, 0]))
    assert len(result.chosen) == 1


def test_near_duplicates_are_reported_not_taken() -> None:
    sim = np.array([[0.0, 0.99, 0.1], [0.99, 0.0, 0.1], [0.1, 0.1, 0.0]])
    result = pack(_problem([5, 5, 5], [1.0, 0.9, 0.5], 100, similar_to=lambda j: sim[:, j]))
    assert sorted(result.chosen) == [0, 2]
    assert result.duplicate_of == {1: 0}


def test_nothing_fits_a_zero_budget() -> None:
    assert pack(_problem([1], [1.0], budget=0)).chosen == ()


def test_one_relevant_answer_beats_several_cheap_weak_lines() -> None:
    # Issue 15: one answer worth 1.0 at 71 tokens against one-liners worth 0.25 at 10.
    costs = [71] + [10] * 8
    utility = [1.0] + [0.25] * 8
    result = pack(_problem(costs, utility, budget=100))
    assert 0 in result.chosen
    assert result.spent <= 100


_items = st.lists(
    st.tuples(st.integers(1, 60), st.floats(0.0, 1.0, allow_nan=False)), min_size=1, max_size=25
)


@settings(max_examples=300, deadline=None)
@given(items=_items, budget=st.integers(0, 300), with_groups=st.booleans())
def test_budget_is_never_exceeded_and_no_relevant_item_is_traded(
    items: list[tuple[int, float]], budget: int, with_groups: bool
) -> None:
    costs = [c for c, _ in items]
    utility = [u for _, u in items]
    m = len(items)
    groups = [[i % 3] for i in range(m)] if with_groups else [[-1]] * m
    group_costs = [4, 5, 6] if with_groups else []
    result = pack(_problem(costs, utility, budget, groups=groups, group_costs=group_costs))
    chosen = set(result.chosen)
    # The spend is exact and within budget.
    paid_groups = {g for j in chosen for g in groups[j] if g >= 0}
    spent = sum(costs[j] for j in chosen) + sum(group_costs[g] for g in paid_groups)
    assert result.spent == spent <= max(budget, 0)
    # A left-out item with some value did not fit beside the chosen items that are at
    # least as relevant: it was never dropped for weaker ones.
    for j in range(m):
        if j in chosen or utility[j] <= 0:
            continue
        better = [i for i in chosen if utility[i] >= utility[j]]
        need = {g for i in [*better, j] for g in groups[i] if g >= 0}
        assert sum(costs[i] for i in better) + costs[j] + sum(group_costs[g] for g in need) > budget
