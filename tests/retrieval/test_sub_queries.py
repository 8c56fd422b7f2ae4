"""Sub-queries from the question's own content words: which they are, what they admit to
the pool, how far they lift it, and that they are off unless asked for."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.retrieval.factories import NOW, T0, memory
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import MemoryIndex, SliceOptions, build_slice
from uprof.retrieval.ranker import analyse_query, rank_memories, sub_queries

COUNTER = TiktokenCounter()
DIM = 8
ON = replace(SliceOptions(), subquery_max=2, subquery_floor=0.5, subquery_members=2)


def _unit(*weights: float) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[: len(weights)] = weights
    return v / np.linalg.norm(v)


def _index(texts: list[str], vectors: list[np.ndarray], actor: str = "Melanie") -> MemoryIndex:
    memories = [
        memory(f"m{i}", text, at=T0 + timedelta(days=i), actor=actor)
        for i, text in enumerate(texts)
    ]
    return MemoryIndex.build(memories, np.stack(vectors), COUNTER)


def _words_index() -> MemoryIndex:
    texts = ["We painted the fence.", "Painting again today.", "Support group was good."]
    return _index(texts, [_unit(1.0, k) for k in range(3)])


# ------------------------------------------------------------------ the sub-queries


def test_sub_queries_are_runs_of_content_words_without_the_speakers_names() -> None:
    index = _words_index()
    assert sub_queries("What are Melanie's hobbies?", index, 3) == ("hobbies",)
    got = sub_queries("What causes does Melanie support with her painting?", index, 3)
    assert set(got) == {"causes", "support", "painting"}


def test_a_word_no_memory_holds_comes_first_then_rarer_words_then_position() -> None:
    index = _words_index()
    # "hobbies" is in no memory; "painting" (stem "paint") is in two, "support" in one.
    question = "Which painting or support, or Melanie's hobbies?"
    assert sub_queries(question, index, 3) == ("hobbies", "support", "painting")
    assert sub_queries(question, index, 1) == ("hobbies",)


def test_adjacent_content_words_stay_one_phrase_and_repeats_and_the_whole_question_go() -> None:
    index = _words_index()
    assert sub_queries("favourite board games and board games", index, 3) == (
        "favourite board games",
        "board games",
    )
    assert sub_queries("hobbies", index, 3) == ()  # the sub-query would be the question
    assert sub_queries("What are Melanie's hobbies?", index, 0) == ()
    assert sub_queries("What is it?", index, 3) == ()


# ------------------------------------------------------------------ admission and lift

# Axis 0: what the question's vector means; axis 1: the category word ("hobbies") alone.
QUERY = _unit(1.0)
SUB = _unit(0.0, 1.0)


def _admission_case() -> tuple[MemoryIndex, list[str]]:
    """Six memories near the question, one near the sub-query only, two strangers."""
    texts = [f"Question-like memory number {i}." for i in range(6)]
    texts += ["I took up pottery.", "Taxes are due.", "The car broke."]
    vectors = [_unit(1.0, 0.0, 0.1 * i) for i in range(6)]
    vectors += [_unit(0.05, 1.0), _unit(0.0, 0.0, 0.0, 1.0), _unit(0.0, 0.0, 0.0, 0.0, 1.0)]
    return _index(texts, vectors), texts


def _ranked(index: MemoryIndex, options: SliceOptions, sub: np.ndarray | None) -> list[str]:
    ranking = rank_memories(
        index, analyse_query("What are Melanie's hobbies?"), QUERY, NOW, options, sub
    )
    return [index.candidates[r].item_id for r in ranking.rows]


def test_a_sub_query_admits_the_instance_the_question_vector_leaves_outside_the_pool() -> None:
    index, _ = _admission_case()
    small = replace(ON, pool_size=4, bridge_weight=0.0)
    assert "m6" not in _ranked(index, replace(small, subquery_max=0), SUB[None, :])
    ranked = _ranked(index, small, SUB[None, :])
    assert "m6" in ranked and len(ranked) <= 4 + small.subquery_members
    # The strangers sit at the sub-query's median: below its floor, never admitted.
    assert "m7" not in ranked and "m8" not in ranked


def test_the_floor_is_on_the_sub_querys_own_scale_and_the_count_is_bounded() -> None:
    index, _ = _admission_case()
    small = replace(ON, pool_size=2, bridge_weight=0.0)
    # Scaled from the median memory (0) to the sub-query's best (1): m6 is its best (1.0).
    assert "m6" in _ranked(index, replace(small, subquery_floor=1.0), SUB[None, :])
    # A floor of 0 (the median) lets every memory pass: the count alone bounds admission.
    open_floor = replace(small, subquery_floor=0.0)
    one = _ranked(index, replace(open_floor, subquery_members=1), SUB[None, :])
    assert len(one) == 3 and "m6" in one  # the pool of 2 and the sub-query's best
    assert len(_ranked(index, replace(open_floor, subquery_members=4), SUB[None, :])) <= 6


def test_the_lift_raises_an_admitted_memory_to_its_share_of_the_best_and_never_lowers() -> None:
    index, _ = _admission_case()
    query = analyse_query("What are Melanie's hobbies?")
    base = rank_memories(index, query, QUERY, NOW, replace(ON, bridge_weight=0.0), SUB[None, :])
    lifted = rank_memories(
        index,
        query,
        QUERY,
        NOW,
        replace(ON, bridge_weight=0.0, subquery_weight=0.5),
        SUB[None, :],
    )
    row = [c.item_id for c in index.candidates].index("m6")
    before = base.utility[base.rows.tolist().index(row)]
    after = lifted.utility[lifted.rows.tolist().index(row)]
    # Strength 1 (the sub-query's best): at least half the best memory's relevance.
    assert after >= 0.5**ON.sharpness - 1e-6 > before
    assert lifted.best == base.best  # the best memory is not lowered


def test_off_by_default_whatever_vectors_are_handed_in() -> None:
    index, _ = _admission_case()
    default = SliceOptions()
    assert default.subquery_max == 0
    assert _ranked(index, default, SUB[None, :]) == _ranked(index, default, None)


def test_build_slice_packs_the_admitted_instance_within_the_budget() -> None:
    index, _ = _admission_case()
    options = replace(ON, pool_size=3, bridge_weight=0.0, subquery_weight=0.5)

    def sliced(opts: SliceOptions) -> str:
        return build_slice(
            query="What are Melanie's hobbies?",
            attributes=[],
            intents=[],
            memory_index=index,
            budget_tokens=200,
            counter=COUNTER,
            query_vector=QUERY,
            now=NOW,
            options=opts,
            subquery_vectors=SUB[None, :],
        ).text

    assert "pottery" not in sliced(replace(options, subquery_max=0))
    text = sliced(options)
    assert "pottery" in text and COUNTER.count(text) <= 200
    assert "Taxes" not in text


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    weight=st.floats(0.0, 1.0),
    floor=st.floats(0.0, 1.0),
    members=st.integers(1, 5),
)
def test_sub_queries_only_add_to_the_pool_and_only_raise_relevance(
    seed: int, weight: float, floor: float, members: int
) -> None:
    rng = np.random.default_rng(seed)
    n = 12
    vectors = [v / np.linalg.norm(v) for v in rng.normal(size=(n, DIM)).astype(np.float32)]
    index = _index([f"memory {i} about topic {i % 3}" for i in range(n)], vectors)
    subs = rng.normal(size=(2, DIM)).astype(np.float32)
    subs /= np.linalg.norm(subs, axis=1, keepdims=True)
    query = analyse_query("what about topic one?")
    qv = vectors[0]
    off = replace(SliceOptions(), pool_size=5)
    on = replace(
        off,
        subquery_max=2,
        subquery_weight=weight,
        subquery_floor=floor,
        subquery_members=members,
    )
    base = rank_memories(index, query, qv, NOW, off)
    got = rank_memories(index, query, qv, NOW, on, subs)
    if weight == 0:  # admission alone: the pool only grows
        assert set(base.rows.tolist()) <= set(got.rows.tolist())
    assert len(got.rows) <= len(base.rows) + 2 * members
    assert got.best == base.best  # a lift is at most the best memory's relevance
    base_rel = dict(zip(base.rows.tolist(), base.utility.tolist(), strict=True))
    got_rel = dict(zip(got.rows.tolist(), got.utility.tolist(), strict=True))
    for row in base_rel.keys() & got_rel.keys():
        # Utilities are relative to the best, which no lift moves: none falls.
        assert got_rel[row] >= base_rel[row] - 1e-6
