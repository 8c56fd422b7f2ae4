"""Sub-queries from the question's own content words fused into its dense score
(XXXX-retrieval-round-18): which they are, how the fusion moves the dense share, and that
it is off unless asked for."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.retrieval.factories import NOW, T0, memory
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import MemoryIndex, SliceOptions, build_slice
from uprof.retrieval.ranker import (
    _cosines,
    analyse_query,
    fused_dense,
    memory_relevance,
    rank_memories,
    sub_queries,
)

COUNTER = TiktokenCounter()
DIM = 8
QUESTION = "What are Melanie's hobbies?"
SUM = replace(SliceOptions(), subquery_max=2, subquery_fusion="sum", subquery_weight=0.5)
MAX = replace(SliceOptions(), subquery_max=2, subquery_fusion="max", subquery_weight=1.0)


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
    assert sub_queries(QUESTION, index, 3) == ("hobbies",)
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
    assert sub_queries(QUESTION, index, 0) == ()
    assert sub_queries("What is it?", index, 3) == ()


# ------------------------------------------------------------------ the fusion

# Axis 0: what the question's vector means; axis 1: the category word ("hobbies") alone.
QUERY = _unit(1.0)
SUB = _unit(0.0, 1.0)


def _instance_case() -> MemoryIndex:
    """Five memories near the question's vector; one instance ("pottery") near the
    sub-query only; strangers. None shares a word with the question (as most missed
    multi-hop turns: XXXX-retrieval-round-18), so the dense score decides."""
    texts = [f"Talking about weekend plans again, number {i}." for i in range(5)]
    texts += ["I took up pottery last month."]
    texts += [f"Taxes and errands, item {i}." for i in range(6)]
    vectors = [_unit(1.0, 0.0, 0.1 * i) for i in range(5)]
    vectors += [_unit(0.35, 1.0)]
    vectors += [_unit(0.0, 0.0, 0.0, 1.0, 0.1 * i) for i in range(6)]
    return _index(texts, vectors)


def _dense_of(index: MemoryIndex, vector: np.ndarray) -> np.ndarray:
    cos = _cosines(index.vectors, vector).astype(np.float64)
    floor = float(np.median(cos))
    return np.clip((cos - floor) / (cos.max() - floor), 0.0, 1.0)


def test_sum_and_max_are_the_stated_mix_of_the_questions_and_the_best_sub_querys_scale() -> None:
    index = _instance_case()
    d = _dense_of(index, QUERY)
    other = _unit(0.0, 0.0, 0.0, 1.0)
    s = np.maximum(_dense_of(index, SUB), _dense_of(index, other))
    subs = np.stack([SUB, other])
    assert np.allclose(fused_dense(index, d, subs, SUM), 0.5 * d + 0.5 * s, atol=1e-6)
    weak = replace(SUM, subquery_weight=0.3)
    assert np.allclose(fused_dense(index, d, subs, weak), 0.7 * d + 0.3 * s, atol=1e-6)
    assert np.allclose(fused_dense(index, d, subs, MAX), np.maximum(d, s), atol=1e-6)
    half = replace(MAX, subquery_weight=0.5)
    assert np.allclose(fused_dense(index, d, subs, half), np.maximum(d, 0.5 * s), atol=1e-6)
    # subquery_max bounds how many sub-queries are read: only the first one here.
    one = replace(SUM, subquery_max=1)
    first = 0.5 * d + 0.5 * _dense_of(index, SUB)
    assert np.allclose(fused_dense(index, d, subs, one), first, atol=1e-6)


def test_only_the_dense_share_of_the_relevance_moves() -> None:
    index = _instance_case()
    query = analyse_query(QUESTION)
    base, weight, scale = memory_relevance(index, query, QUERY, NOW, SliceOptions())
    got, weight_on, scale_on = memory_relevance(index, query, QUERY, NOW, SUM, SUB[None, :])
    assert weight_on == weight and scale_on == scale  # profile lines keep the question's scale
    d = _dense_of(index, QUERY)
    expected = base + (1.0 - weight) * (0.5 * _dense_of(index, SUB) - 0.5 * d)
    assert np.allclose(got, expected, atol=1e-5)


def _order(index: MemoryIndex, options: SliceOptions, sub: np.ndarray | None) -> list[str]:
    ranking = rank_memories(index, analyse_query(QUESTION), QUERY, NOW, options, sub)
    return [index.candidates[r].item_id for r in ranking.rows]


def test_the_instance_the_question_vector_ranks_low_rises_above_memories_nearer_it() -> None:
    index = _instance_case()
    quiet = replace(SliceOptions(), bridge_weight=0.0, neighbour_weight=0.0)
    # Main: the five memories near the question's vector come first.
    assert _order(index, quiet, SUB[None, :]).index("m5") >= 5
    for options in (SUM, MAX):
        on = replace(options, bridge_weight=0.0, neighbour_weight=0.0)
        assert _order(index, on, SUB[None, :]).index("m5") < 5


def test_off_by_default_whatever_vectors_are_handed_in() -> None:
    index = _instance_case()
    default = SliceOptions()
    assert default.subquery_max == 0 and default.subquery_weight == 0.0
    assert _order(index, default, SUB[None, :]) == _order(index, default, None)
    # A weight of 0 is off too, and no vectors leave the order as main's.
    assert _order(index, replace(SUM, subquery_weight=0.0), SUB[None, :]) == _order(
        index, default, None
    )
    assert _order(index, SUM, None) == _order(index, default, None)


def test_an_unknown_fusion_is_refused_by_name() -> None:
    index = _instance_case()
    wrong = replace(SUM, subquery_fusion="mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="subquery_fusion"):
        fused_dense(index, _dense_of(index, QUERY), SUB[None, :], wrong)


def test_build_slice_packs_the_instance_within_the_budget() -> None:
    index = _instance_case()

    def sliced(opts: SliceOptions) -> str:
        return build_slice(
            query=QUESTION,
            attributes=[],
            intents=[],
            memory_index=index,
            budget_tokens=30,
            counter=COUNTER,
            query_vector=QUERY,
            now=NOW,
            options=replace(opts, bridge_weight=0.0, neighbour_weight=0.0),
            subquery_vectors=SUB[None, :],
        ).text

    # Room for one memory: main takes the one nearest the question's vector.
    main = sliced(SliceOptions())
    assert "weekend plans" in main and "pottery" not in main
    for options in (SUM, MAX):
        text = sliced(options)
        assert "pottery" in text and COUNTER.count(text) <= 30
        assert "Taxes" not in text


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000), weight=st.floats(0.0, 1.0), mode=st.sampled_from(["sum", "max"])
)
def test_the_fused_dense_score_stays_a_scaled_score_and_max_never_lowers(
    seed: int, weight: float, mode: str
) -> None:
    rng = np.random.default_rng(seed)
    n = 12
    vectors = [v / np.linalg.norm(v) for v in rng.normal(size=(n, DIM)).astype(np.float32)]
    index = _index([f"memory {i} about topic {i % 3}" for i in range(n)], vectors)
    subs = rng.normal(size=(2, DIM)).astype(np.float32)
    subs /= np.linalg.norm(subs, axis=1, keepdims=True)
    d = _dense_of(index, vectors[0])
    on = replace(SliceOptions(), subquery_max=2, subquery_fusion=mode, subquery_weight=weight)
    got = fused_dense(index, d, subs, on)
    assert got.shape == d.shape
    assert np.all(got >= -1e-9) and np.all(got <= 1.0 + 1e-9)
    if mode == "max":
        assert np.all(got >= d - 1e-9)
    else:  # a convex mix: between the two scales
        s = np.maximum(_dense_of(index, subs[0]), _dense_of(index, subs[1]))
        assert np.all(got >= np.minimum(d, s) - 1e-6) and np.all(got <= np.maximum(d, s) + 1e-6)
