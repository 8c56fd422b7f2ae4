"""Sentence-level dense matching of long memories (``SliceOptions.sentence_scoring``, MaxP)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest

from tests.retrieval.factories import NOW, T0, memory
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import MemoryIndex, SliceOptions
from uprof.retrieval.ranker import analyse_query, memory_relevance

COUNTER = TiktokenCounter()
PLAIN = SliceOptions(recency_weight=0.0, heat_weight=0.0, actor_weight=0.0)
#: No memory shares a word with it: the fused relevance is the dense score alone.
QUERY = analyse_query("Anything about jogging?")


def _unit(*weights: float) -> np.ndarray:
    v = np.zeros(4, dtype=np.float32)
    v[: len(weights)] = weights
    return v / np.linalg.norm(v)


def _case() -> MemoryIndex:
    """m0 is long: its whole vector (cosine 0.6) is diluted, its first sentence is the
    query's own direction (cosine 1). m1..m4 have one sentence (cosines 0.8, 0.2, 0, 0)."""
    texts = [
        "I went for a run at dawn. Then I cooked a big breakfast for everyone.",
        "Morning exercise keeps me sane.",
        "The weather turned cold.",
        "My cat sleeps all day.",
        "We painted the kitchen.",
    ]
    memories = [
        memory(f"m{i}", t, at=T0 + timedelta(days=i), actor="Sam") for i, t in enumerate(texts)
    ]
    vectors = np.stack(
        [
            _unit(0.6, 0.0, 0.8),
            _unit(0.8, 0.6),
            _unit(0.2, np.sqrt(0.96)),
            _unit(0.0, 0.0, 1.0),
            _unit(0.0, 0.0, 0.0, 1.0),
        ]
    )
    index = MemoryIndex.build(memories, vectors, COUNTER)
    # Given out of order on purpose: with_sentences groups them by memory.
    sentences = np.stack([_unit(0.0, 0.0, 1.0), _unit(1.0)])
    return index.with_sentences(sentences, [0, 0])


def _dense(options: SliceOptions, index: MemoryIndex | None = None) -> list[float]:
    fused, weight, _ = memory_relevance(index or _case(), QUERY, _unit(1.0), NOW, options)
    assert weight == 0.0  # no word match: dense only
    return [float(x) for x in fused]


# Whole cosines 0.6/0.8/0.2/0/0: median 0.2, best 0.8 -> scaled 2/3, 1, 0, 0, 0.
WHOLE = [2 / 3, 1.0, 0.0, 0.0, 0.0]
# Best sentence cosines 1/0.8/0.2/0/0 (one-sentence memories: their whole text): median
# 0.2, best 1 -> scaled 1, 0.75, 0, 0, 0.
BEST = [1.0, 0.75, 0.0, 0.0, 0.0]


def test_off_by_default_the_sentence_vectors_change_nothing() -> None:
    assert PLAIN.sentence_scoring == "off"
    assert _dense(PLAIN) == pytest.approx(WHOLE, abs=1e-6)
    plain_index = replace(_case(), sentence_vectors=None, sentence_rows=None)
    for mode in ("max", "mix"):
        # An index without sentence vectors keeps the whole-text score in every mode.
        got = _dense(replace(PLAIN, sentence_scoring=mode), plain_index)
        assert got == pytest.approx(WHOLE, abs=1e-6)


def test_max_takes_the_better_of_the_whole_text_and_the_best_sentence() -> None:
    got = _dense(replace(PLAIN, sentence_scoring="max"))
    assert got == pytest.approx([max(w, b) for w, b in zip(WHOLE, BEST, strict=True)], abs=1e-6)
    # The long memory's matching sentence lifts it to the top, level with m1.
    assert got[0] == pytest.approx(got[1], abs=1e-6)
    assert _dense(PLAIN)[0] < _dense(PLAIN)[1]


@pytest.mark.parametrize("w", [0.3, 0.5])
def test_mix_weighs_the_best_sentence_by_sentence_weight(w: float) -> None:
    got = _dense(replace(PLAIN, sentence_scoring="mix", sentence_weight=w))
    expected = [(1 - w) * a + w * b for a, b in zip(WHOLE, BEST, strict=True)]
    assert got == pytest.approx(expected, abs=1e-6)


def test_the_dense_scale_handed_to_profile_lines_stays_the_whole_texts() -> None:
    index = _case()
    _, _, off = memory_relevance(index, QUERY, _unit(1.0), NOW, PLAIN)
    _, _, on = memory_relevance(
        index, QUERY, _unit(1.0), NOW, replace(PLAIN, sentence_scoring="max")
    )
    assert off is not None and on is not None
    assert (on.floor, on.span) == (off.floor, off.span) == pytest.approx((0.2, 0.6), abs=1e-6)


def test_with_sentences_groups_rows_by_memory_and_refuses_bad_rows() -> None:
    index = _case()
    vectors = np.stack([_unit(1.0), _unit(0.0, 1.0), _unit(0.0, 0.0, 1.0)])
    grouped = index.with_sentences(vectors * 2, [3, 0, 3])
    assert grouped.sentence_rows is not None and grouped.sentence_vectors is not None
    assert grouped.sentence_rows.tolist() == [0, 3, 3]
    assert np.allclose(grouped.sentence_vectors, [_unit(0.0, 1.0), _unit(1.0), _unit(0, 0, 1)])
    with pytest.raises(ValueError, match="names no memory"):
        index.with_sentences(vectors, [0, 1, 5])
    with pytest.raises(ValueError, match="one sentence row"):
        index.with_sentences(vectors, [0, 1])
