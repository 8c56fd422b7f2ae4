"""``POST /v1/quarantine/retry`` releases a capture only for an operator key that still
stands when the release is written (SQLite and PostgreSQL, a live server, the key revoked
by ``uprof apps revoke`` in a process of its own).

A retry is decided when it arrives, then extracts the capture again (the model's call,
outside the subject's writer turn: it may take long) and, in the subject's writer turn,
saves the extraction's results with ``CaptureReleased`` and records ``capture.released``
naming the key. The route built its door without the key's check (``scope_with_role``,
0218-key-rechecked-at-the-write's Left), and the save asked nothing: a key revoked while
the extraction ran still released the capture (200, ``released``), its attributes and
memories written and served, the log naming the revoked key as the one that did it
(bug UR). The test holds the extraction as a slow model would, revokes the key with the
CLI, lets the server's read of the key row age past ``KEY_CACHE_TTL_S`` and sees the
server refuse the key on another request before it lets the extraction finish.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from tests.api.conftest import PLANNER, LiveServer, bearer, grant, interaction, revoke_with_the_cli
from tests.fakes.ports import FakeExtractor
from tests.kernel.poison import MARK, PoisonExtractor
from uprof.api import ApiKeyStore
from uprof.apikeys.store import KEY_CACHE_TTL_S
from uprof.kernel import Uprof
from uprof.settings import Settings


class _SlowModel:
    """The extractor of the retry: says when the extraction started, finishes it only
    once the test releases it (a model that takes its time)."""

    def __init__(self, inner: FakeExtractor) -> None:
        self._inner = inner
        self.name = inner.name
        self.started = threading.Event()
        self.release = threading.Event()

    def extract(self, capture: Any) -> Any:
        self.started.set()
        assert self.release.wait(60), "the test never released the extraction"
        return self._inner.extract(capture)


def _quarantined(http: httpx.Client, kernel: Uprof, token: str) -> str:
    """A capture of alice's the pipeline set aside (its extractor failed every time)."""
    poisoned = PoisonExtractor(FakeExtractor())
    kernel.extraction._extractor = poisoned
    grant(http, token)
    ack = http.post(
        "/v1/captures",
        headers=bearer(token),
        json={"subject": "alice", **interaction(f"I live in {MARK}ville")},
    )
    assert ack.status_code == 201, ack.text
    deadline = time.monotonic() + 60
    while kernel.lag().quarantined != 1:
        assert time.monotonic() < deadline, "the capture was never quarantined"
        time.sleep(0.05)
    return str(ack.json()["capture_id"])


def _released_entries(kernel: Uprof, capture_id: str) -> int:
    kernel.reads.drain()
    return sum(
        1
        for e in kernel.audit_log.entries(action="capture.released")
        if capture_id in e.entry.get("event_ids", [])
    )


def _retry_while_the_model_runs(
    server: LiveServer, kernel: Uprof, token: str, capture_id: str, meanwhile: Any
) -> httpx.Response:
    model = _SlowModel(FakeExtractor())
    kernel.extraction._extractor = model
    answers: list[httpx.Response] = []
    with httpx.Client(base_url=server.url, timeout=60) as http:
        post = threading.Thread(
            target=lambda: answers.append(
                http.post(
                    "/v1/quarantine/retry",
                    headers=bearer(token),
                    json={"capture_ids": [capture_id]},
                )
            )
        )
        post.start()
        try:
            assert model.started.wait(60), "the retry never extracted the capture"
            meanwhile(http)
        finally:
            model.release.set()
        post.join(60)
    assert answers, "the retry never answered"
    return answers[0]


def test_ur_a_retry_whose_key_was_revoked_while_it_extracted_releases_nothing(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug UR: the operator key is revoked by another process while its retry's
    extraction runs, and the server already refuses it elsewhere. The release is asked
    again with the key in its writer turn: 401, the capture still quarantined, no
    ``capture.released``."""
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER, ["app", "operator"])
    with httpx.Client(base_url=server.url, timeout=60) as http:
        capture_id = _quarantined(http, kernel, issued.token)

    def revoked_elsewhere(http: httpx.Client) -> None:
        revoke_with_the_cli(settings, issued.info.key_id)
        clock[0] += KEY_CACHE_TTL_S + 0.1  # the server's read of the row has aged
        refused = http.get("/v1/quarantine", headers=bearer(issued.token))
        assert refused.status_code == 401, refused.text  # revoked, as the server sees it

    answer = _retry_while_the_model_runs(
        server, kernel, issued.token, capture_id, revoked_elsewhere
    )
    assert answer.status_code == 401, answer.text
    assert [q.capture_id for q in kernel.quarantined()] == [capture_id]
    assert _released_entries(kernel, capture_id) == 0


def test_held_a_retry_whose_key_stands_releases_the_capture(
    server: LiveServer, kernel: Uprof, keys: ApiKeyStore
) -> None:
    """The guard: the same wait, the key standing (the server answered it meanwhile):
    released, one ``capture.released``."""
    issued = keys.create(PLANNER, ["app", "operator"])
    with httpx.Client(base_url=server.url, timeout=60) as http:
        capture_id = _quarantined(http, kernel, issued.token)

    def still_standing(http: httpx.Client) -> None:
        shown = http.get("/v1/quarantine", headers=bearer(issued.token))
        assert shown.status_code == 200, shown.text

    answer = _retry_while_the_model_runs(server, kernel, issued.token, capture_id, still_standing)
    assert answer.status_code == 200, answer.text
    assert [o["outcome"] for o in answer.json()["outcomes"]] == ["released"]
    assert kernel.quarantined() == []
    assert _released_entries(kernel, capture_id) == 1
