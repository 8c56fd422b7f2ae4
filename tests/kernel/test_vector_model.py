"""A store's vectors are one model's: a process with another model neither projects nor
serves, until a rebuild re-embeds everything with it (uprof.vector_model, decision 0049)."""

from __future__ import annotations

import textwrap
import time

import numpy as np
import pytest
import sqlalchemy as sa

from domain.errors import EmbedderMismatchError
from tests.children import PythonChild, run_python
from tests.conftest import Backend
from tests.fakes.ports import FakeClock, FakeExtractor
from tests.kernel.conftest import consent, say, settings_for
from uprof.adapters.embeddings import HashingEmbedder
from uprof.bootstrap import bootstrap
from uprof.kernel import Uprof


class OtherModel(HashingEmbedder):
    """Same width as the hashing stand-in, other vectors: nothing but the record tells."""

    name = "other"

    def embed(self, texts):  # type: ignore[no-untyped-def]
        vectors = super().embed(texts)
        return np.ascontiguousarray(vectors[:, ::-1])


def start(backend: Backend, embedder: HashingEmbedder) -> Uprof:
    return bootstrap(
        settings_for(backend), clock=FakeClock(), embedder=embedder, extractor=FakeExtractor()
    )


def ask(kernel: Uprof, query: str = "what do I love, jazz or opera") -> str:
    return kernel.slice(
        "alice",
        query,
        budget_tokens=512,
        purpose="personalization",
        app_id="app:planner",
        agent_id="agent:one",
    ).text


def recorded_rows(kernel: Uprof) -> list[tuple[str, int]]:
    table = kernel.app._tracking_table()
    with kernel.app.events_engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                f"SELECT application_name, notification_id FROM {table} "
                "WHERE application_name LIKE 'embedder:%'"
            )
        ).all()
    return [(str(name), int(n)) for name, n in rows]


def test_the_first_embedding_records_the_model(backend: Backend) -> None:
    kernel = start(backend, HashingEmbedder())
    try:
        assert recorded_rows(kernel) == []  # a start alone records nothing
        consent(kernel)
        kernel.capture("alice", say("I love jazz and hiking"))
        kernel.process()
        assert recorded_rows(kernel) == [("embedder:hashing", 384)]
        assert "jazz" in ask(kernel)
    finally:
        kernel.close()


def embedded_by_hashing(backend: Backend) -> None:
    """A store whose memory vectors the hashing stand-in made (and records)."""
    first = start(backend, HashingEmbedder())
    try:
        consent(first)
        first.capture("alice", say("I love jazz and hiking"))
        first.process()
    finally:
        first.close()


def test_another_model_neither_serves_nor_projects_until_a_rebuild(backend: Backend) -> None:
    embedded_by_hashing(backend)
    other = start(backend, OtherModel())
    try:
        with pytest.raises(EmbedderMismatchError, match="made by embedder=hashing"):
            ask(other)
        # The log still takes captures.
        other.capture("alice", say("I love opera and rowing", day=2))
        with pytest.raises(EmbedderMismatchError):
            other.process()  # projecting would store vectors of two models side by side
        other.rebuild()
        assert recorded_rows(other) == [("embedder:other", 384)]
        assert "opera" in ask(other)
    finally:
        other.close()

    again = start(backend, HashingEmbedder())  # now the old model is the stranger
    try:
        with pytest.raises(EmbedderMismatchError, match="made by embedder=other"):
            ask(again)
    finally:
        again.close()


def test_a_second_process_with_another_model_is_refused(backend: Backend) -> None:
    embedded_by_hashing(backend)
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from tests.kernel.conftest import settings_for
        from tests.conftest import Backend
        from tests.kernel.test_vector_model import OtherModel, ask, start
        from domain.errors import EmbedderMismatchError

        backend = Backend({backend.kind!r}, {backend.url!r}, Path({str(backend.data_dir)!r}))
        kernel = start(backend, OtherModel())
        try:
            ask(kernel)
        except EmbedderMismatchError as e:
            print("refused:", e)
            sys.exit(0)
        finally:
            kernel.close()
        sys.exit(1)
        """
    )
    result = run_python(script)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "made by embedder=hashing" in result.stdout


def test_processes_claiming_at_once_with_two_models_agree_on_one(backend: Backend) -> None:
    """Six processes, three per model, claim a fresh store at the same instant: every one
    of them must read back the same recorded model (the claim row is locked first)."""
    start(backend, HashingEmbedder()).close()  # schema in place before the race
    barrier = backend.data_dir / "barrier"
    barrier.mkdir()
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from tests.conftest import Backend
        from tests.kernel.test_vector_model import start
        from uprof.adapters.embeddings import HashingEmbedder

        backend = Backend({backend.kind!r}, {backend.url!r}, Path({str(backend.data_dir)!r}))
        barrier = Path({str(barrier)!r})
        kernel = start(backend, HashingEmbedder())
        try:
            (barrier / sys.argv[2]).touch()
            while not (barrier / "go").exists():
                time.sleep(0.001)
            print("recorded:", kernel.app.claim_embedder(sys.argv[1], 384))
        finally:
            kernel.close()
        """
    )
    children = [
        PythonChild(script, "model-a" if i % 2 else "model-b", f"ready-{i}") for i in range(6)
    ]
    answers = []
    try:
        deadline = time.monotonic() + 240
        while len(list(barrier.glob("ready-*"))) < 6 and time.monotonic() < deadline:
            if any(child.poll() is not None for child in children):
                break  # one died before the race: its stderr is reported below
            time.sleep(0.01)
        (barrier / "go").touch()
        for child in children:
            out, err = child.communicate(timeout=300)
            assert child.returncode == 0, err[-3000:]
            answers.append(out.strip())
    finally:
        for child in children:  # a failed or timed-out wait leaves no process behind
            if child.poll() is None:
                child.kill()
                child.communicate()
    assert len(set(answers)) == 1, answers
    assert answers[0] in {"recorded: model-a", "recorded: model-b"}
