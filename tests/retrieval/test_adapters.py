"""Token counter and embedders."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uprof.adapters.embeddings import HashingEmbedder, SentenceEmbedder
from uprof.adapters.tokens import TiktokenCounter


def test_counts_cl100k_ids(counter: TiktokenCounter) -> None:
    assert counter.count("") == 0
    assert counter.count("hello") == 1  # [15339] in cl100k_base
    assert counter.count("[8 May 2023] Caroline: hi") == 10


def test_special_token_text_is_counted_as_plain_text(counter: TiktokenCounter) -> None:
    assert counter.count("<|endoftext|>") > 1


def test_batch_count_matches_single(counter: TiktokenCounter) -> None:
    texts = ["one line", "ünïcödé 🙂", "", "a\nb"]
    assert counter.count_batch(texts) == [counter.count(t) for t in texts]


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=300), limit=st.integers(min_value=-2, max_value=80))
def test_truncate_never_exceeds_the_limit(text: str, limit: int) -> None:
    counter = TiktokenCounter()
    cut = counter.truncate(text, limit)
    assert counter.count(cut) <= max(limit, 0)
    assert text.startswith(cut.rstrip("\ufffd")) or cut == ""
    if counter.count(text) <= limit:
        assert cut == text


def test_hashing_embedder_is_deterministic_and_normalised(embedder: HashingEmbedder) -> None:
    texts = ["I adopted a puppy", "My dog is a golden retriever", "", "quarterly tax filing"]
    a = embedder.embed(texts)
    b = HashingEmbedder().embed(list(texts))
    assert a.dtype == np.float32 and a.shape == (4, 384)
    np.testing.assert_array_equal(a, b)
    norms = np.linalg.norm(a, axis=1)
    np.testing.assert_allclose(norms[[0, 1, 3]], 1.0, rtol=1e-5)
    assert norms[2] == 0.0  # nothing to hash: a zero row, not NaN


def test_hashing_embedder_scores_shared_words_higher(embedder: HashingEmbedder) -> None:
    q, near, far = embedder.embed(["painting a sunrise", "I painted a sunrise", "tax forms"])
    assert float(q @ near) > float(q @ far)


def test_minilm_refuses_a_missing_model_folder(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(FileNotFoundError):
        SentenceEmbedder(tmp_path / "nowhere")


@pytest.fixture(scope="module")
def minilm() -> SentenceEmbedder:
    """One loaded model for the tests below (a load is seconds of CPU), one torch thread
    as the product runs it (FIELD-NOTES 8.3: torch's default is 30x slower on busy cores)."""
    embedder = SentenceEmbedder(torch_threads=1)
    embedder.load()
    return embedder


@pytest.mark.model
def test_minilm_embeds_semantically(minilm: SentenceEmbedder) -> None:
    embedder = minilm
    vectors = embedder.embed(["I love my dog", "My puppy is adorable", "The invoice is overdue"])
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-4)
    assert float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2])
    assert embedder.embed([]).shape == (0, 384)


@pytest.mark.model
def test_one_text_is_embedded_directly_and_exactly_as_encode_would(
    minilm: SentenceEmbedder,
) -> None:
    """A query skips encode's per-call overhead (decision 0041-slice-latency-round-2), and
    its vector is bit for bit the one encode gives, short, long (truncated) or empty."""
    embedder = minilm
    assert embedder._direct  # the load-time probe agreed
    texts = [
        "What did Caroline research?",
        "When did Melanie paint a sunrise? " * 60,  # longer than the model's 256 tokens
        "",
        "Ça va? Je suis allée à Zürich 🙂",
    ]
    for text in texts:
        assert np.array_equal(embedder.embed([text]), embedder._encode([text]))
    # Several texts still go through encode, batched and sorted by length.
    assert np.array_equal(embedder.embed(texts), embedder._encode(texts))


@pytest.mark.model
def test_one_model_embeds_from_several_threads_at_once_exactly_as_from_one(
    minilm: SentenceEmbedder,
) -> None:
    """A server embeds questions on its query threads while the projection embeds
    batches of memories (decision 0042): the shared tokenizer and model must give
    every thread the vectors one thread gets, and raise nothing (a fast tokenizer whose
    settings change between calls raises "Already borrowed" across threads)."""
    from concurrent.futures import ThreadPoolExecutor

    embedder = minilm
    singles = [f"What did person {i} do in {1990 + i}?" + " really" * (i % 7) for i in range(24)]
    batches = [
        [f"I went hiking near lake {i} with {j} friends" * (1 + (i + j) % 4) for j in range(9)]
        for i in range(6)
    ]
    calls: list[list[str]] = [[q] for q in singles] + batches
    expected = [embedder.embed(texts) for texts in calls]
    with ThreadPoolExecutor(max_workers=4) as pool:
        for _ in range(3):
            got = list(pool.map(embedder.embed, calls))
            for want, have in zip(expected, got, strict=True):
                assert np.array_equal(want, have)


@pytest.mark.model
def test_loading_the_model_prints_nothing_and_logs_the_load() -> None:
    # A fresh process: the progress bar is process-wide state, so it must be off from the
    # first load on, as in a CLI command or the MCP server.
    script = (
        "import logging, sys\n"
        "logging.basicConfig(stream=sys.stdout, level=logging.INFO, format='%(message)s')\n"
        "from uprof.adapters.embeddings import SentenceEmbedder\n"
        "SentenceEmbedder(torch_threads=1).embed(['hello'])  # one thread: FIELD-NOTES 8.3\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    assert "Loading weights" not in done.stderr
    assert done.stderr.strip() == ""
    assert "embedding model loaded" in done.stdout
