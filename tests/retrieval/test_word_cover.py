"""Question-word coverage in the packer (decision XXXX-retrieval-round-16).

A question names a category ("what activities does Melanie do?"); its evidence names the
instances ("we went camping"), which hold none of the question's words. The memories
that do hold a question word rank above the instances, and main's packer spends the
budget on them one after another. With coverage, once enough chosen memories show a
question word, more memories showing only that word lose part of their gain.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.retrieval.factories import NOW, T0, memory
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import MemoryIndex, SliceOptions, build_slice
from uprof.retrieval import builder as builder_module
from uprof.retrieval.packer import PackProblem, _Packing, pack

COUNTER = TiktokenCounter()


def _problem(
    utility: list[float],
    holds: list[list[bool]] | None,
    budget: int,
    cover: int = 0,
    penalty: float = 0.0,
    costs: list[int] | None = None,
) -> PackProblem:
    m = len(utility)
    return PackProblem(
        costs=np.asarray(costs or [10] * m),
        utility=np.asarray(utility, dtype=float),
        owner=np.arange(m),
        groups=np.full((m, 1), -1),
        group_costs=np.zeros(0, dtype=np.int64),
        similar_to=None,
        budget=budget,
        holds=None if holds is None else np.asarray(holds, dtype=bool).reshape(m, -1),
        word_cover=cover,
        word_cover_penalty=penalty,
    )


# Three memories hold the question's one word ("activities"), two are instances that hold
# none; room for three.
UTILITY = [1.0, 0.9, 0.8, 0.6, 0.5]
HOLDS = [[True], [True], [True], [False], [False]]


def test_held_main_spends_the_budget_on_the_question_words_holders() -> None:
    # Main's packer (coverage off, its default): the three holders, no instance.
    assert sorted(pack(_problem(UTILITY, HOLDS, budget=30)).chosen) == [0, 1, 2]


def test_once_a_word_is_covered_the_instances_are_taken() -> None:
    chosen = pack(_problem(UTILITY, HOLDS, budget=30, cover=1, penalty=0.5)).chosen
    assert chosen == (0, 3, 4)  # the best holder, then the instances (0.9 * 0.5 < 0.5)


def test_coverage_grows_with_each_holder_up_to_word_cover() -> None:
    state = _Packing(_problem(UTILITY, HOLDS, budget=100, cover=2, penalty=0.5))
    assert state.covered().tolist() == [0.0] * 5
    state.take(0)
    assert state.covered().tolist() == [0.5, 0.5, 0.5, 0.0, 0.0]
    assert np.allclose(state.gains(), [0.75, 0.675, 0.6, 0.6, 0.5])
    state.take(1)
    state.take(2)  # a third holder: the word stays covered at 1, not beyond
    assert state.covered().tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_a_memory_is_discounted_by_its_least_covered_question_word() -> None:
    # Memory 1 holds words a and b; only a is covered, so b is still news it brings.
    holds = [[True, False], [True, True], [False, True]]
    state = _Packing(_problem([1.0, 0.9, 0.8], holds, budget=100, cover=1, penalty=0.5))
    state.take(0)
    assert state.covered().tolist() == [1.0, 0.0, 0.0]
    assert np.allclose(state.gains(), [0.5, 0.9, 0.8])


def test_off_unless_both_knobs_are_set() -> None:
    plain = pack(_problem(UTILITY, None, budget=30)).chosen
    for cover, penalty in [(0, 0.5), (2, 0.0)]:
        assert pack(_problem(UTILITY, HOLDS, budget=30, cover=cover, penalty=penalty)).chosen == (
            plain
        )


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.02, 1.0), st.lists(st.booleans(), min_size=3, max_size=3), st.integers(1, 9)
        ),
        min_size=1,
        max_size=12,
    ),
    st.integers(1, 3),
    st.floats(0.1, 0.9),
)
def test_coverage_never_raises_a_gain_and_never_touches_a_memory_without_question_words(
    items: list[tuple[float, list[bool], int]], cover: int, penalty: float
) -> None:
    utility = [u for u, _, _ in items]
    holds = [h for _, h, _ in items]
    problem = _problem(utility, holds, budget=10**6, cover=cover, penalty=penalty)
    state = _Packing(problem)
    without = np.asarray(utility)
    for order in range(len(items)):
        gains = state.gains()
        assert np.all(gains <= without + 1e-12)
        assert np.all(gains >= without * (1.0 - penalty) - 1e-12)
        holds_none = ~np.asarray(holds).any(axis=1)
        assert np.allclose(gains[holds_none], without[holds_none])
        state.take(order)


def _activities_index() -> MemoryIndex:
    texts = [
        "Melanie: I love outdoor activities, they keep me sane.",
        "Caroline: What activities do you like, Melanie?",
        "Melanie: We went camping with the kids last weekend.",
    ]
    memories = [
        memory(f"m{i}", text, at=T0 + timedelta(days=i), actor=text.split(":")[0])
        for i, text in enumerate(texts)
    ]
    return MemoryIndex.build(memories, None, COUNTER)


def test_build_slice_hands_the_packer_the_question_words_each_memory_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    index = _activities_index()
    seen: list[tuple[list[Any], PackProblem]] = []
    original = builder_module._problem

    def keep(choices: list[Any], *args: Any) -> PackProblem:
        problem = original(choices, *args)
        seen.append((choices, problem))
        return problem

    monkeypatch.setattr(builder_module, "_problem", keep)
    keep_all = SliceOptions(min_utility=0.0)  # the camping turn stays a choice
    for options in (keep_all, replace(keep_all, word_cover=1, word_cover_penalty=0.5)):
        build_slice(
            query="What activities does Melanie do?",
            attributes=[],
            intents=[],
            memory_index=index,
            budget_tokens=400,
            counter=COUNTER,
            query_vector=None,
            now=NOW,
            options=options,
        )
    (_, off), (choices, on) = seen
    assert off.holds is None  # main's path builds nothing for coverage
    assert on.word_cover == 1 and on.word_cover_penalty == 0.5
    assert on.holds is not None
    # One column, "activities": "Melanie" is a speaker, not a BM25 word; the rest are
    # stopwords. The two turns that say it hold it; the camping turn does not.
    assert on.holds.shape == (len(choices), 1)
    held = {c.candidate.item_id: bool(on.holds[j, 0]) for j, c in enumerate(choices)}
    assert held == {"m0": True, "m1": True, "m2": False}
