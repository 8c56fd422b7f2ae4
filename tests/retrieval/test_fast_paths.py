"""The latency work of decision 0041-slice-latency-round-2 computes the same numbers.

Each fast path is checked bit for bit against the code it replaced, kept here as the
reference, on random subjects of several sizes (so the cached per-seed statistics are
exercised both on a first query and on later ones that reuse them).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from tests.retrieval import golden_slices
from tests.retrieval.factories import T0, attribute, intent, memory
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import MemoryIndex, ProfileLines, SliceOptions, build_slice, ranker, render
from uprof.retrieval.ranker import _seed_links, _with_bridges

COUNTER = TiktokenCounter()


def _reference_bridges(
    index: MemoryIndex, relevance: np.ndarray, options: SliceOptions
) -> np.ndarray:
    """``_with_bridges`` as it was before the round-2 latency work."""
    k = min(options.bridge_seeds, len(relevance))
    assert index.vectors is not None
    seeds = np.argpartition(-relevance, k - 1)[:k]
    n = len(relevance)
    # The seeds' cosines are _seed_links' (einsum's again since decision 0185); the
    # product is tested on its own below; everything after it is the round-2 reference.
    links = _seed_links(index.vectors[seeds], index.vectors).T
    ranked = np.partition(links, [(n - 1) // 2, n // 2, n - 2], axis=0)
    floor = (ranked[(n - 1) // 2] + ranked[n // 2]) / 2
    closest_other = ranked[n - 2]
    strength = np.clip((links - floor) / np.maximum(closest_other - floor, 1e-9), 0.0, 1.0)
    strength[seeds, np.arange(k)] = 0.0
    lent = (strength * relevance[seeds]).max(axis=1)
    lifted: np.ndarray = np.maximum(relevance, options.bridge_weight * lent.astype(relevance.dtype))
    return lifted


def _index(n: int, rng: np.random.Generator) -> MemoryIndex:
    memories = [memory(f"m{i}", f"turn {i}", at=T0 + timedelta(minutes=i)) for i in range(n)]
    vectors = rng.standard_normal((n, 48)).astype(np.float32)
    vectors[n // 2] = vectors[n // 3]  # a repeated turn: two rows with equal cosines
    return MemoryIndex.build(memories, vectors, COUNTER)


@pytest.mark.parametrize("n", [3, 4, 11, 200, 1_001, 5_003])  # 5,003: split in two threads
def test_bridges_equal_the_reference_bit_for_bit(n: int) -> None:
    rng = np.random.default_rng(n)
    index = _index(n, rng)
    for weight in (0.5, 1.0):
        options = SliceOptions(bridge_weight=weight)
        for _ in range(6):  # later queries reuse seeds whose spread is cached
            relevance = rng.random(n).astype(np.float32)
            if n > 10:
                relevance[rng.choice(n, 3)] = relevance.max()  # ties among the seeds
            expected = _reference_bridges(index, relevance, options)
            got = _with_bridges(index, relevance.copy(), options)
            assert got.dtype == expected.dtype
            assert np.array_equal(got, expected)


@pytest.mark.parametrize("busy_helper", [False, True])
def test_seed_links_split_in_two_equal_one_product_bit_for_bit(busy_helper: bool) -> None:
    """Large indexes are split between two threads (decision 0042); with the helper
    thread busy, the caller takes its half back. Either way, the whole product's bits."""
    import threading

    rng = np.random.default_rng(42)
    vectors = rng.standard_normal((ranker._SPLIT_LINKS_FROM * 2 + 7, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    seeds = vectors[rng.choice(len(vectors), 10, replace=False)]
    release = threading.Event()
    blocker = ranker._links_helper.submit(release.wait, 30) if busy_helper else None
    try:
        got = _seed_links(seeds, vectors)
    finally:
        release.set()
    if blocker is not None:
        assert blocker.result() is True  # the helper was held for the whole call
    assert got.shape == (10, len(vectors))
    assert np.array_equal(got, np.einsum("kj,ij->ki", seeds, vectors))


def _unit_rows(n: int, width: int, rng: np.random.Generator) -> np.ndarray:
    vectors = rng.standard_normal((n, width)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


@pytest.mark.parametrize("n", [3, 17, 1_001, ranker._SPLIT_LINKS_FROM * 2 + 7])
def test_seed_links_are_einsums_cosines_to_float32_rounding(n: int) -> None:
    """The product moves a cosine by float32 rounding only, never by more."""
    rng = np.random.default_rng(n)
    vectors = _unit_rows(n, 384, rng)
    seeds = vectors[rng.choice(n, min(10, n), replace=False)]
    got = _seed_links(seeds, vectors)
    exact = np.einsum("kj,ij->ki", seeds.astype(np.float64), vectors.astype(np.float64))
    assert got.dtype == np.float32
    assert np.abs(got - exact).max() < 2e-6
    assert np.abs(got - np.einsum("kj,ij->ki", seeds, vectors)).max() < 2e-6


@pytest.mark.parametrize("n", [5, 64, 1_001, ranker._SPLIT_LINKS_FROM * 2 + 7])
def test_equal_memory_vectors_get_equal_cosines_wherever_they_sit(n: int) -> None:
    """Tie stability: a turn repeated word for word has the same vector, and its copies
    must stay tied (and so rank chronologically) whatever their positions: first, last,
    either side of the split between the two threads."""
    rng = np.random.default_rng(n + 1)
    vectors = _unit_rows(n, 384, rng)
    half = n // 2
    spots = sorted({0, 1, half - 1, half, half + 1, n - 2, n - 1, *rng.choice(n, 5).tolist()})
    vectors[spots] = vectors[spots[2]]
    seeds = vectors[rng.choice(n, min(10, n), replace=False)]
    links = _seed_links(seeds, vectors)
    for row in links:
        assert len(set(row[spots].tolist())) == 1


# Bug KU (decision 0168-review-of-0162): OpenBLAS computes a small product (SkylakeX:
# at most 100^3 multiply-adds) with its small-matrix kernel and a one-seed product with
# its matrix-vector kernel; both sum the last, remainder rows in another order, so two
# copies of one turn got cosines one bit apart, and so different bridged relevance.
# Every size up to well past those kernels' bounds, with 10, 2 and 1 seeds.
_TIE_SIZES = [
    *((n, min(10, n)) for n in range(3, 1_200, 7)),
    *((n, 2) for n in range(1_000, 1_400, 13)),
    *((n, 1) for n in (3, 7, 1_001, ranker._SPLIT_LINKS_FROM * 2 + 7)),
]


def test_copies_of_one_turn_get_one_cosine_at_every_size_and_seed_count() -> None:
    rng = np.random.default_rng(162)
    split = []
    for n, k in _TIE_SIZES:
        vectors = _unit_rows(n, 384, rng)
        spots = sorted({0, n - 1, n - 2, *rng.choice(n, 3).tolist()})
        vectors[spots] = vectors[spots[0]]
        links = _seed_links(vectors[rng.choice(n, k, replace=False)], vectors)
        if any(len(set(row[spots].tolist())) != 1 for row in links):
            split.append((n, k))
    assert split == []


def test_copies_of_one_turn_keep_one_bridged_relevance_in_a_small_index() -> None:
    """What KU did to a slice: a repeated turn reached only through a bridge got a
    different relevance per copy, so its copies no longer ranked chronologically."""
    rng = np.random.default_rng(1)
    uneven = 0
    for n in (5, 7, 9, 13, 30, 61):
        for _ in range(20):
            vectors = _unit_rows(n, 384, rng)
            copies = [1, n - 2, n - 1]
            vectors[copies] = vectors[copies[0]]
            index = MemoryIndex.build(
                [memory(f"m{i}", f"turn {i}", at=T0 + timedelta(minutes=i)) for i in range(n)],
                vectors,
                COUNTER,
            )
            relevance = rng.random(n).astype(np.float32) * 0.5
            relevance[copies] = 0.01  # only a bridge lifts the repeated turn
            bridged = _with_bridges(index, relevance, SliceOptions())
            uneven += len(set(bridged[copies].tolist())) != 1
    assert uneven == 0


def test_numpys_blas_runs_on_one_thread_once_the_ranker_is_loaded() -> None:
    """A multi-threaded BLAS product waits for the other core (decision 0162-slice-speed)."""
    import scipy.linalg  # noqa: F401  loads scipy's own BLAS too, as the embedder's stack does
    from threadpoolctl import threadpool_info

    # numpy's own BLAS, the one its matmul calls: a BLAS loaded later by another package
    # (scipy's, through sentence-transformers) keeps its own setting and is not ours.
    blas = [
        lib
        for lib in threadpool_info()
        if lib["user_api"] == "blas" and "numpy" in Path(lib["filepath"]).parent.name
    ]
    assert blas, "numpy's BLAS was not found"
    assert all(lib["num_threads"] == 1 for lib in blas)


def test_a_fresh_process_asking_blas_for_two_threads_gets_one_once_it_ranks() -> None:
    """The check above runs in the test process, where the environment may already pin
    BLAS to one thread: here a real child asks for two (``OPENBLAS_NUM_THREADS``), loads
    the kernel as every uprof process does, and must end with numpy's BLAS on one thread
    (review of 0162: a change that drops the limit fails here on any machine)."""
    import os
    import subprocess
    import sys

    probe = (
        "import json, pathlib, threadpoolctl, uprof.kernel;"
        "print(json.dumps([lib['num_threads'] for lib in threadpoolctl.threadpool_info()"
        " if lib['user_api'] == 'blas' and 'numpy' in pathlib.Path(lib['filepath']).parent.name]))"
    )
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[1]"


def test_the_seed_spread_is_kept_per_index_and_never_shared() -> None:
    rng = np.random.default_rng(7)
    one, other = _index(50, rng), _index(50, rng)
    relevance = rng.random(50).astype(np.float32)
    _with_bridges(one, relevance, SliceOptions())
    assert len(one._spread) == 10 and other._spread == {}
    assert np.array_equal(
        _with_bridges(other, relevance, SliceOptions()),
        _reference_bridges(other, relevance, SliceOptions()),
    )


class _CountingCounter:
    """Counts tokens like the real counter and remembers how often it was asked."""

    def __init__(self) -> None:
        self.calls = 0

    def count(self, text: str) -> int:
        self.calls += 1
        return COUNTER.count(text)


def test_profile_lines_are_rendered_once_per_candidate_and_never_for_another() -> None:
    counter = _CountingCounter()
    lines = ProfileLines(counter)  # type: ignore[arg-type]
    diet = attribute("a1", "diet", "diet: vegetarian", confidence=0.5)
    first, marked = lines.variants(diet, summarise=False)
    assert first == (
        (render.attribute_line(diet), COUNTER.count(render.attribute_line(diet)) + 1, False),
    )
    assert marked  # confidence 0.5 carries a mark
    asked = counter.calls
    assert lines.variants(diet, summarise=False) == (first, marked)
    assert counter.calls == asked  # served from the cache
    # An equal-looking but new candidate (the view moved) is rendered from its own text.
    vegan = replace(diet, text="diet: vegan")
    assert lines.variants(vegan, summarise=False)[0][0][0] == render.attribute_line(vegan)
    # The same candidate as an intent (summarised variants) is not served the attribute line.
    goal = intent(
        "i1", "Run a half marathon in spring. Then rest for a month and plan the next one."
    )
    variants, _ = lines.variants(goal, summarise=True)
    assert [v[0] for v in variants] == [
        render.intent_line(goal, summary=False),
        render.intent_line(goal, summary=True),
    ]
    assert [v[2] for v in variants] == [False, True]


def test_profile_lines_stay_bounded() -> None:
    lines = ProfileLines(COUNTER, max_entries=3)
    kept = [attribute(f"a{i}", "hobbies", f"hobbies: chess {i}") for i in range(10)]
    for candidate in kept:
        lines.variants(candidate, summarise=False)
        assert len(lines) <= 3


def test_a_slice_with_kept_profile_lines_equals_one_without() -> None:
    memories, attributes, intents = golden_slices.subject()
    index = MemoryIndex.build(memories, None, COUNTER)
    lines = ProfileLines(COUNTER)
    for query in golden_slices.QUERIES[:4]:
        plain, kept = (
            build_slice(
                query=query,
                attributes=attributes,
                intents=intents,
                memory_index=index,
                budget_tokens=512,
                counter=COUNTER,
                query_vector=None,
                now=golden_slices.NOW,
                profile_lines=cache,
            )
            for cache in (None, lines)
        )
        assert kept.text == plain.text and kept.left_out == plain.left_out
    assert len(lines) > 0
