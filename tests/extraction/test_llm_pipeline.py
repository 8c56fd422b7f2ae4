"""The LLM extractor in the pipeline: while the endpoint fails, captures wait.

Nothing is extracted by other means (unless ``llm_fallback="rules"``), nothing is
lost, the background worker reports the endpoint's error (readiness shows it), and
once the endpoint answers the waiting captures are extracted. Both backends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tests.conftest import Backend
from tests.extraction.fake_openai import FakeOpenAI, Reply, chat_json
from tests.kernel.conftest import consent, say
from uprof.adapters.embeddings import HashingEmbedder
from uprof.adapters.extraction.errors import ExtractionError
from uprof.api.runtime import PipelineWorker
from uprof.bootstrap import bootstrap
from uprof.kernel import Uprof
from uprof.settings import Settings

ANSWER = {"attributes": [{"key": "diet", "value": "vegetarian", "confidence": 0.9}]}


def _kernel(backend: Backend, fake: FakeOpenAI, fallback: str) -> Uprof:
    settings = Settings(
        data_dir=backend.data_dir / "data",
        database_url=backend.url if backend.kind == "postgres" else None,
        embedder="hashing",  # type: ignore[arg-type]
        extractor="llm",
        llm_base_url=fake.base_url,
        llm_model="m1",
        llm_timeout_s=2.0,
        llm_fallback=fallback,  # type: ignore[arg-type]
    )
    return bootstrap(settings, embedder=HashingEmbedder())


@pytest.fixture
def waiting(backend: Backend, fake_llm: FakeOpenAI) -> Iterator[Uprof]:
    k = _kernel(backend, fake_llm, "wait")
    try:
        yield k
    finally:
        k.close()


def test_captures_wait_while_the_endpoint_fails(waiting: Uprof, fake_llm: FakeOpenAI) -> None:
    consent(waiting)
    waiting.capture("alice", say("I am vegetarian."))
    fake_llm.script(Reply(status=503, body="overloaded"))
    with pytest.raises(ExtractionError, match="HTTP 503"):
        waiting.process()
    assert waiting.lag().extraction_pending == 1  # kept in the log, not extracted, not skipped
    # Embedded, a read brings the views up to date in the caller's thread, so it
    # meets the same error (docs/extractors.md); a server's reads wait instead.
    with pytest.raises(ExtractionError, match="HTTP 500"):
        waiting.profile("alice")

    fake_llm.script(chat_json(ANSWER))
    waiting.process()
    assert waiting.lag().extraction_pending == 0
    [diet] = waiting.profile("alice").attributes
    assert (diet.key, diet.value) == ("diet", "vegetarian")
    [capture] = waiting.queries.all_captures(str(waiting.stream_of("alice")))
    assert diet.evidence == (capture.capture_id,)


def test_the_worker_reports_the_endpoint_error(
    waiting: Uprof, fake_llm: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    consent(waiting)
    waiting.capture("alice", say("I am vegetarian."))
    worker = PipelineWorker(waiting, threading.Lock())
    worker.start()  # the fake answers 500 to every unscripted request
    try:
        deadline = time.monotonic() + 20
        while worker.status.state != "failing" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert worker.status.state == "failing"
        # What readiness shows as "pipeline worker failing: <last_error>": the class only
        # (/readyz needs no key, and a message may quote the model's answer); the
        # operator's log has the whole error.
        assert worker.status.last_error == "ExtractionError"
        assert "HTTP 500" in caplog.text
        # The endpoint's failure is not the capture's: it waits, never quarantined.
        assert waiting.lag().quarantined == 0
    finally:
        worker.stop()
    assert waiting.lag().extraction_pending == 1


def test_rules_fallback_extracts_instead(backend: Backend, fake_llm: FakeOpenAI) -> None:
    k = _kernel(backend, fake_llm, "rules")
    try:
        consent(k)
        k.capture("alice", say("I am vegetarian."))
        fake_llm.script(Reply(status=503, body="overloaded"))
        k.process()
        assert k.lag().extraction_pending == 0
        assert [a.key for a in k.profile("alice").attributes] == ["diet"]
    finally:
        k.close()
