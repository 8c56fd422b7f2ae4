"""Fixtures shared by the retrieval tests."""

from __future__ import annotations

import pytest

from uprof.adapters.embeddings import HashingEmbedder
from uprof.adapters.tokens import TiktokenCounter


@pytest.fixture(scope="session")
def counter() -> TiktokenCounter:
    return TiktokenCounter()


@pytest.fixture(scope="session")
def embedder() -> HashingEmbedder:
    return HashingEmbedder()
