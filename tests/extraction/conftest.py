"""Fixtures for the extraction tests: a fake OpenAI-compatible model server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.extraction.fake_openai import FakeOpenAI, running_fake_openai


@pytest.fixture
def fake_llm() -> Iterator[FakeOpenAI]:
    """A running fake OpenAI-compatible server on 127.0.0.1 and a free port."""
    with running_fake_openai() as state:
        yield state
