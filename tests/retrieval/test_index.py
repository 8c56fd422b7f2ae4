"""The per-subject memory index."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.retrieval.factories import T0, attribute, conversation, memory
from uprof.adapters.embeddings import HashingEmbedder
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import MemoryIndex
from uprof.retrieval.ranker import PoolSimilarity
from uprof.retrieval.text import stem, terms


def test_bm25_ranks_the_matching_memory_first(counter: TiktokenCounter) -> None:
    mems = conversation(
        [
            ("Caroline", "I went to a LGBTQ support group yesterday."),
            ("Melanie", "I painted a sunrise by the lake last year."),
            ("Caroline", "Work has been busy lately."),
        ]
    )
    index = MemoryIndex.build(mems, None, counter)
    scores = index.bm25_scores(["paint", "sunris"])
    assert int(np.argmax(scores)) == 1
    assert scores[0] == 0 and scores[2] == 0


def test_memories_are_kept_in_chronological_order(counter: TiktokenCounter) -> None:
    late = memory("late", "second", at=T0 + timedelta(days=2))
    early = memory("early", "first", at=T0)
    undated = memory("undated", "no date", at=None)
    index = MemoryIndex.build([late, early, undated], None, counter)
    assert [c.item_id for c in index.candidates] == ["undated", "early", "late"]


def test_neighbours_are_close_in_time_only(counter: TiktokenCounter) -> None:
    mems = [
        *conversation([("A", "q?"), ("B", "answer")]),
        memory("later", "much later", at=T0 + timedelta(days=3)),
    ]
    index = MemoryIndex.build(mems, None, counter)
    assert index.next.tolist() == [1, -1, -1]
    assert index.prev.tolist() == [-1, 0, -1]


def test_costs_are_precomputed_with_the_real_counter(counter: TiktokenCounter) -> None:
    mems = conversation(
        [("Caroline", "I went to a LGBTQ support group yesterday."), ("Melanie", "Wow.")]
    )
    index = MemoryIndex.build(mems, None, counter)
    assert index.lines[0] == "Caroline: I went to a LGBTQ support group yesterday."
    assert index.line_costs[0] == counter.count(index.lines[0]) + 1
    assert index.dated_lines[0].startswith("[8 May 2023] Caroline: ")
    assert index.day_headers == ("[8 May 2023]",)


def test_one_speaker_is_not_labelled_on_every_line(counter: TiktokenCounter) -> None:
    # A label that tells no one apart only costs tokens.
    mems = conversation([("Caroline", "I went to a support group."), ("Caroline", "It helped.")])
    index = MemoryIndex.build(mems, None, counter)
    assert index.lines == ("I went to a support group.", "It helped.")


def test_vectors_are_reordered_with_their_memories(counter: TiktokenCounter) -> None:
    embedder = HashingEmbedder()
    late = memory("late", "dogs and puppies", at=T0 + timedelta(days=1))
    early = memory("early", "tax forms", at=T0)
    index = MemoryIndex.build([late, early], embedder.embed([late.text, early.text]), counter)
    assert index.vectors is not None
    np.testing.assert_allclose(index.vectors[1], embedder.embed([late.text])[0], rtol=1e-6)


def test_rejects_non_memories_and_misaligned_vectors(counter: TiktokenCounter) -> None:
    with pytest.raises(ValueError):
        MemoryIndex.build([attribute("a", "diet", "vegan")], None, counter)
    with pytest.raises(ValueError):
        MemoryIndex.build([memory("m", "x")], np.zeros((2, 384), dtype=np.float32), counter)


_WORDS = "dog cat lake sunrise paint group support work busy music cello run marathon".split()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from(_WORDS), min_size=0, max_size=6), min_size=1, max_size=25),
    st.data(),
)
def test_lexical_pool_similarity_is_the_cosine_of_term_sets(
    texts: list[list[str]], data: st.DataObject
) -> None:
    """Columns read through the pool's postings equal the full term-set cosine product."""
    mems = conversation([("A", " ".join(words) or "hm") for words in texts])
    index = MemoryIndex.build(mems, None, TiktokenCounter())
    rows = np.asarray(
        data.draw(st.permutations(range(len(mems))))[: data.draw(st.integers(1, len(mems)))]
    )
    pool = PoolSimilarity(index, rows)
    terms = index.bm25.term_sets[rows]
    expected = (terms @ terms.T).toarray()
    ks = np.asarray(data.draw(st.lists(st.integers(0, len(rows) - 1), min_size=1, max_size=8)))
    assert np.allclose(pool.columns(ks), expected[:, ks], atol=1e-6)
    assert np.allclose(pool.column(int(ks[0])), expected[:, ks[0]], atol=1e-6)


def test_snowball_stemming_folds_inflections_and_derivations() -> None:
    assert terms("hobbies") == terms("hobby")
    assert terms("painting paints painted") == [stem("paint")] * 3
    assert terms("friends") == terms("friend")
    assert stem("2023") == "2023"  # numbers stay as they are


def test_stemming_is_safe_from_many_threads() -> None:
    # A Snowball stemmer keeps per-call buffers; one is made per thread.
    from concurrent.futures import ThreadPoolExecutor

    words = [f"{w}{s}" for w in ("paint", "camp", "swim", "hike", "cook") for s in ("s", "ing")]
    uncached = stem.__wrapped__  # past the cache, so every call runs a stemmer
    expected = [uncached(w) for w in words]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda _: [uncached(w) for w in words * 50], range(32)))
    assert all(r == expected * 50 for r in results)
