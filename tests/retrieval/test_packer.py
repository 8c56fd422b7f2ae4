"""The budgeted selection on its own."""

from __future__ import annotations

import numpy as np

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
    )


def test_fix_up_beats_plain_ratio_greedy() -> None:
    # Ratio greedy takes the two cheap items (ratio 0.5) and then cannot fit the big one
    # (ratio 0.45); the big one alone is worth more than both cheap ones together.
    result = pack(_problem([10, 10, 100], [5.0, 5.0, 45.0], budget=105))
    assert result.chosen == (2,)


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
