"""Lexical credit that depends on the dense side (round 14, knobs that default to off).

``SliceOptions.lexical_confirm_at``: a memory's word match counts in proportion to how far
its meaning stands above the subject's median. ``SliceOptions.lexical_crowd_coherence``: a
query word held by a crowd of memories scattered in meaning loses its credit, one held by a
tight topic keeps it. The case is round 13's diagnosis (0217-retrieval-round-13): one common
question word shared by many unrelated memories lifts them as a block over the memory
closest in meaning.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.retrieval.factories import NOW, T0, attribute, memory
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import MemoryIndex, SliceOptions
from uprof.retrieval.ranker import (
    analyse_query,
    confirmation,
    crowd_credit,
    memory_relevance,
    rank_memories,
    rank_profile_items,
)

COUNTER = TiktokenCounter()
PLAIN = SliceOptions(recency_weight=0.0, heat_weight=0.0, actor_weight=0.0)
DIM = 16
QUESTION = "Which activities?"


def _axis(i: int, lean: float = 0.0) -> np.ndarray:
    """A unit vector on axis ``i``, leaning ``lean`` towards the question's axis 0."""
    v = np.zeros(DIM, dtype=np.float32)
    v[i] = 1.0
    v[0] += lean
    return v / np.linalg.norm(v)


def _subject(crowd_axes: list[int]) -> tuple[MemoryIndex, np.ndarray]:
    """m0, the answer (no question word, closest in meaning); c*, the word's holders on
    ``crowd_axes``; f*, fillers sharing one meaning that hold no question word."""
    texts = ["I love hiking steep mountain trails at dawn."]
    vectors = [_axis(0)]
    for i, axis in enumerate(crowd_axes):
        texts.append(f"Weekend activities number {i} were fine.")
        vectors.append(_axis(axis))
    for i in range(6):
        texts.append(f"Filler note {i} about the weather.")
        vectors.append(_axis(DIM - 1, lean=0.1))
    memories = [memory(f"m{i}", t, at=T0 + timedelta(days=i)) for i, t in enumerate(texts)]
    return MemoryIndex.build(memories, np.stack(vectors), COUNTER), _axis(0)


SCATTERED = [1, 2, 3, 4, 5, 6]  # unrelated memories sharing one word: a crowd
TIGHT = [1, 1, 1, 1, 1, 1]  # memories about one thing sharing its word: a topic


def _best(options: SliceOptions) -> str:
    index, query_vector = _subject(SCATTERED)
    ranking = rank_memories(index, analyse_query(QUESTION), query_vector, NOW, options)
    return index.candidates[int(ranking.rows[0])].text


def test_held_a_scattered_crowd_outranks_the_answer_without_either_knob() -> None:
    """Held (round 13's finding, main's fusion): the crowd sharing "activities" is ranked
    above the memory closest in meaning, which shares no word with the question."""
    assert "activities" in _best(PLAIN)


def test_confirmation_lets_the_meaning_decide_over_a_crowd() -> None:
    assert _best(replace(PLAIN, lexical_confirm_at=0.5)).startswith("I love hiking")


def test_crowd_credit_lets_the_meaning_decide_over_a_scattered_crowd() -> None:
    assert _best(replace(PLAIN, lexical_crowd_coherence=0.1)).startswith("I love hiking")


def test_confirmation_is_the_share_of_the_way_to_the_confirming_point() -> None:
    dense = np.asarray([0.0, 0.25, 0.5, 1.0])
    on = replace(PLAIN, lexical_confirm_at=0.5)
    assert confirmation(dense, on).tolist() == pytest.approx([0.0, 0.5, 1.0, 1.0])
    assert confirmation(dense, PLAIN).tolist() == [1.0, 1.0, 1.0, 1.0]


def test_confirmation_keeps_a_word_match_the_meaning_supports() -> None:
    """A memory at the best dense score keeps its whole lexical score."""
    index, query_vector = _subject(SCATTERED)
    query = analyse_query("Which activities or hiking?")
    plain, weight, _ = memory_relevance(index, query, query_vector, NOW, PLAIN)
    confirmed, *_ = memory_relevance(
        index, query, query_vector, NOW, replace(PLAIN, lexical_confirm_at=0.5)
    )
    assert confirmed[0] == pytest.approx(plain[0])  # the answer holds "hiking", dense 1
    assert all(confirmed[1:7] < plain[1:7])  # the crowd sits at the median, dense 0
    assert weight == PLAIN.lexical_weight


def test_a_tight_topic_keeps_its_credit_and_a_scattered_crowd_loses_it() -> None:
    options = replace(PLAIN, lexical_crowd_coherence=0.1)
    scattered, _ = _subject(SCATTERED)
    tight, _ = _subject(TIGHT)
    (word,) = analyse_query(QUESTION).terms  # "activities", as the index stems it
    assert crowd_credit(scattered, [word], options) == {word: 0.0}
    assert crowd_credit(tight, [word], options) == {word: 1.0}


def test_a_word_with_fewer_holders_than_the_crowd_size_keeps_its_credit() -> None:
    index, _ = _subject(SCATTERED)  # six holders
    words = list(analyse_query(QUESTION).terms)
    seven = replace(PLAIN, lexical_crowd_coherence=0.1, lexical_crowd_size=7)
    assert crowd_credit(index, words, seven) == {}
    assert crowd_credit(index, words, replace(seven, lexical_crowd_size=6)) != {}
    assert crowd_credit(index, words, PLAIN) == {}  # off


def test_profile_lines_are_credited_as_the_memories_are() -> None:
    """A line holding only the crowd's word loses its word credit with the memories'."""
    index, query_vector = _subject(SCATTERED)
    query = analyse_query(QUESTION)
    line = [attribute("a1", "hobbies", "activities: board games")]
    line_vector = np.stack([_axis(7)])

    def utility(options: SliceOptions) -> float:
        ranking = rank_memories(index, query, query_vector, NOW, options)
        out = rank_profile_items(
            line,
            query,
            line_vector,
            query_vector,
            0.0,
            index=index,
            ranking=ranking,
            options=options,
        )
        return float(out[0])

    assert utility(PLAIN) > 0.0
    assert utility(replace(PLAIN, lexical_crowd_coherence=0.1)) == 0.0
    assert utility(replace(PLAIN, lexical_confirm_at=0.5)) == 0.0


@settings(max_examples=50, deadline=None)
@given(
    dense=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=20),
    at=st.floats(0.01, 1.0),
)
def test_confirmation_never_adds_lexical_credit(dense: list[float], at: float) -> None:
    share = confirmation(np.asarray(dense), replace(PLAIN, lexical_confirm_at=at))
    assert ((share >= 0.0) & (share <= 1.0)).all()
    assert (np.diff(share[np.argsort(dense)]) >= -1e-12).all()  # more meaning, more credit
