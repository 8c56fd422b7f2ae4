"""A long capture is kept whole: windows of sentences, each a memory citing the capture."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime

import pytest

from domain.values import Interaction
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import settings_for
from uprof.adapters.embeddings import HashingEmbedder
from uprof.adapters.extraction.rules import DEFAULT_MEMORY_MAX_CHARS, segment_spans
from uprof.bootstrap import bootstrap

APP = "app:planner"
PURPOSE = "personalization"
#: Invented words, one per sentence, so each sentence has a word only it contains.
_SYLLABLES = ("ka", "lo", "mi", "ne", "su", "ta", "vo", "ri", "pe", "du")


def _marker(i: int) -> str:
    return "zq" + "".join(_SYLLABLES[int(d)] for d in f"{i:04d}")


_WORDS = (
    "river bridge market garden harbour station museum library bakery orchard castle meadow "
    "tower chapel square fountain forest valley island lighthouse canal vineyard theatre "
    "stadium cottage quarry mill barn pier alley tunnel ferry tram bus lantern kite violin "
    "camera bicycle umbrella basket ladder compass blanket teapot notebook parcel"
).split()


def _narrative(n_chars: int) -> list[str]:
    """Sentences of varied words and lengths; every 17th is longer than a memory window."""
    rng = random.Random(15)
    sentences: list[str] = []
    i = 0
    while sum(len(s) + 1 for s in sentences) < n_chars:
        n_words = 120 if i % 17 == 5 else rng.randint(4, 20)
        words = " ".join(rng.choice(_WORDS) for _ in range(n_words))
        sentences.append(f"On that day I saw the {_marker(i)} with {words}.")
        i += 1
    return sentences


def test_spans_cover_the_text_in_bounded_windows() -> None:
    text = " ".join(_narrative(20_000))
    spans = segment_spans(text, DEFAULT_MEMORY_MAX_CHARS)
    assert all(0 < b - a <= DEFAULT_MEMORY_MAX_CHARS for a, b in spans)
    assert all(b1 <= a2 for (_, b1), (a2, _) in itertools.pairwise(spans))
    kept = "".join(text[a:b] for a, b in spans)
    assert kept.replace(" ", "") == text.replace(" ", "")


@pytest.mark.parametrize("budget", [256])
def test_every_sentence_of_a_long_capture_can_be_reached(backend: Backend, budget: int) -> None:
    sentences = _narrative(20_000)
    text = " ".join(sentences)
    assert len(text) >= 20_000
    kernel = bootstrap(settings_for(backend), clock=FakeClock(), embedder=HashingEmbedder())
    try:
        kernel.grant_consent("alice", app_id=APP, categories=["*"], purposes=[PURPOSE])
        ack = kernel.capture(
            "alice",
            Interaction(
                app_id=APP,
                agent_id="agent:one",
                occurred_at=datetime(2025, 1, 1, 9, tzinfo=UTC),
                user_input=text,
                source_ref="D1:1",
                purpose=PURPOSE,
                sharing="shared",
            ),
        )
        kernel.process()
        for i, sentence in enumerate(sentences):
            result = kernel.slice(
                "alice",
                # The sentence's own word: what is tested is that every window is
                # reachable, not how a question word no memory holds ("see") is weighed.
                f"the {_marker(i)}",
                budget_tokens=budget,
                purpose=PURPOSE,
                app_id=APP,
                agent_id="agent:one",
            )
            assert result.n_tokens <= budget
            shown = [item for item in result.items if _marker(i) in item.text]
            assert shown, f"sentence {i} is in no slice item"
            # The memory showing it cites the long capture and its caller's ref.
            assert shown[0].evidence == (ack.capture_id,)
            assert shown[0].source_refs == ("D1:1",)
            # Whole sentences stay whole unless longer than a window.
            if len(sentence) <= DEFAULT_MEMORY_MAX_CHARS:
                assert sentence in " ".join(item.text for item in shown)
    finally:
        kernel.close()


def test_each_window_records_its_span_in_the_capture(backend: Backend) -> None:
    text = " ".join(_narrative(5_000))
    kernel = bootstrap(settings_for(backend), clock=FakeClock(), embedder=HashingEmbedder())
    try:
        kernel.grant_consent("alice", app_id=APP, categories=["*"], purposes=[PURPOSE])
        kernel.capture(
            "alice",
            Interaction(
                app_id=APP,
                agent_id="agent:one",
                occurred_at=datetime(2025, 1, 1, 9, tzinfo=UTC),
                user_input=text,
                purpose=PURPOSE,
                sharing="shared",
            ),
        )
        kernel.process()
        rows, _ = kernel.queries.memories(str(kernel.stream_of("alice")))
        assert len(rows) > 1
        for row in rows:
            start, end = (int(x) for x in row.detail["span"].split("-"))
            assert text[start:end] == row.text
    finally:
        kernel.close()
