"""A process that was running when another process rebuilt the store with another model
(both backends, two real processes).

``uprof projections rebuild`` with another embedder re-embeds every memory and records
the new model; a process started afterwards with the old model is refused
(tests/kernel/test_vector_model.py). A process that was already running had checked the
record once, before its first embedding, and kept that answer: it went on projecting new
memories with the old model into a store whose vectors were now the other model's (two
models side by side; same width, so nothing failed) and ranking slices by noise.
"""

from __future__ import annotations

import textwrap
import time

import pytest

from domain.errors import EmbedderMismatchError
from tests.children import run_python
from tests.conftest import Backend
from tests.kernel.conftest import consent, say
from tests.kernel.test_vector_model import ask, recorded_rows, start
from uprof.adapters.embeddings import HashingEmbedder
from uprof.vector_model import RECHECK_S


def rebuild_with_another_model(backend: Backend) -> None:
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from tests.conftest import Backend
        from tests.kernel.test_vector_model import OtherModel, start

        backend = Backend({backend.kind!r}, {backend.url!r}, Path({str(backend.data_dir)!r}))
        kernel = start(backend, OtherModel())
        try:
            kernel.rebuild()
        finally:
            kernel.close()
        """
    )
    done = run_python(script)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_running_process_neither_projects_nor_serves_after_a_rebuild_with_another_model(
    backend: Backend,
) -> None:
    running = start(backend, HashingEmbedder())
    try:
        consent(running)
        running.capture("alice", say("I love jazz and hiking"))
        running.process()
        assert "jazz" in ask(running)  # checked the record: its own model

        rebuild_with_another_model(backend)
        assert recorded_rows(running) == [("embedder:other", 384)]

        running.capture("alice", say("I love opera and rowing", day=2))
        with pytest.raises(EmbedderMismatchError, match="made by embedder=other"):
            running.process()  # would store the old model's vectors beside the new ones
        with pytest.raises(EmbedderMismatchError, match="made by embedder=other"):
            ask(running)
    finally:
        running.close()


def test_a_running_process_stops_serving_within_the_recheck_bound_after_such_a_rebuild(
    backend: Backend,
) -> None:
    running = start(backend, HashingEmbedder())
    try:
        consent(running)
        running.capture("alice", say("I love jazz and hiking"))
        running.process()
        assert "jazz" in ask(running)

        rebuild_with_another_model(backend)
        time.sleep(RECHECK_S)  # a slice may use the answer of a check this recent
        with pytest.raises(EmbedderMismatchError, match="made by embedder=other"):
            ask(running)
    finally:
        running.close()
