"""The question is embedded on another thread while the slice reads the subject (0042).

Deterministic, no timing: the fakes hand-shake through events, so a version that embeds
the question only after reading the subject fails by timing out a wait, and a version
that loses the embedder's error or leaves threads behind fails its assertion.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pytest

from tests.kernel.conftest import APP, consent, say
from uprof.adapters.embeddings import HashingEmbedder
from uprof.kernel import Uprof

QUESTION = "which instrument am I learning?"
WAIT_S = 10.0


class _Watched:
    """HashingEmbedder that signals when it starts embedding the question."""

    def __init__(self, *, fail: bool = False) -> None:
        self._inner = HashingEmbedder()
        self.dimension = self._inner.dimension
        self.question_started = threading.Event()
        self.threads: list[str] = []
        self._fail = fail

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if list(texts) == [QUESTION]:
            self.threads.append(threading.current_thread().name)
            self.question_started.set()
            if self._fail:
                raise RuntimeError("the embedding model broke")
        return self._inner.embed(texts)


def _planner_slice(kernel: Uprof, *, lexical_only: bool = False):
    return kernel.slice(
        "alice",
        QUESTION,
        budget_tokens=256,
        purpose="personalization",
        app_id=APP,
        agent_id="agent:one",
        lexical_only=lexical_only,
    )


def _seed(kernel: Uprof) -> None:
    consent(kernel)
    kernel.capture("alice", say("I want to learn the cello", ref="D1:3"))
    kernel.process()


def test_the_question_is_embedded_while_the_subject_is_read(kernel: Uprof) -> None:
    _seed(kernel)
    service = kernel.slice_service
    watched = _Watched()
    service._embedder = watched
    fresh_check = service._ensure_fresh
    overlapped: list[bool] = []

    def ensure_fresh_after_the_question_started(*args):
        # Embedding only after reading the subject would never set the event here.
        overlapped.append(watched.question_started.wait(WAIT_S))
        return fresh_check(*args)

    service._ensure_fresh = ensure_fresh_after_the_question_started
    result = _planner_slice(kernel)
    assert overlapped == [True]
    assert watched.threads and all(t.startswith("uprof-query-embed") for t in watched.threads)
    assert "cello" in result.text


def test_the_overlapped_slice_equals_the_sequential_one(kernel: Uprof) -> None:
    """Same items, text and tokens as embedding the question in the serving thread."""
    _seed(kernel)
    service = kernel.slice_service
    overlapped = _planner_slice(kernel)
    real = service._embedder
    vector = real.embed([QUESTION])

    class _Done:
        """A future that already holds the serving thread's own vector."""

        def result(self) -> np.ndarray:
            return vector

        def cancel(self) -> bool:
            return False

    started: list[str] = []

    def in_this_thread(embedder, query: str) -> _Done:
        started.append(query)
        return _Done()

    service._ahead.start = in_this_thread  # type: ignore[method-assign]
    sequential = _planner_slice(kernel)
    assert started == [QUESTION]
    assert sequential.text == overlapped.text
    assert sequential.items == overlapped.items
    assert sequential.n_tokens == overlapped.n_tokens


def test_an_embedding_error_reaches_the_caller(kernel: Uprof) -> None:
    _seed(kernel)
    kernel.slice_service._embedder = _Watched(fail=True)
    with pytest.raises(RuntimeError, match="the embedding model broke"):
        _planner_slice(kernel)
    # The pool is still usable after a failed task.
    kernel.slice_service._embedder = _Watched()
    assert "cello" in _planner_slice(kernel).text


def test_lexical_only_slices_embed_nothing(kernel: Uprof) -> None:
    _seed(kernel)
    watched = _Watched()
    kernel.slice_service._embedder = watched
    result = _planner_slice(kernel, lexical_only=True)
    assert "cello" in result.text
    assert not watched.question_started.is_set()


def test_closing_the_kernel_stops_the_embedding_threads(kernel: Uprof) -> None:
    _seed(kernel)
    _planner_slice(kernel)
    pool = kernel.slice_service._ahead._pool
    assert pool is not None
    threads = list(pool._threads)
    assert threads and all(t.is_alive() for t in threads)
    kernel.slice_service.close()
    for thread in threads:
        thread.join(WAIT_S)
    assert not any(t.is_alive() for t in threads)
