"""A capture is written only for a key that still stands when the capture has its turn
(SQLite and PostgreSQL, a live server, the key revoked by ``uprof apps revoke`` in a
process of its own).

``POST /v1/captures`` is decided when it arrives (the key, the policy's ``capture``) and
queued for the capture writer, which commits groups of requests, each subject in its
writer turn (another group of the same subject saving first). The consent is read at
the write; the key was not asked again there: a key revoked while the capture waited for
its turn, and already refused by the server elsewhere, still had its capture written,
201 (bug TW, found in the pass over the write routes the brief asked for).

The writer turns are the server process's locks (another process's writer shows as a
version conflict, retried behind them): the test holds the subject's turns as another
group would, revokes the key with the CLI in another process, lets the server's read of
the key row age past ``KEY_CACHE_TTL_S`` and sees the server refuse the key on another
request before it lets the capture through.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from typing import Any
from uuid import UUID

import httpx
import pytest

from tests.api.conftest import PLANNER, LiveServer, bearer, grant, interaction, revoke_with_the_cli
from uprof.api import ApiKeyStore
from uprof.apikeys.store import KEY_CACHE_TTL_S
from uprof.kernel import Uprof
from uprof.settings import Settings

TEXT = "I live in Lisbon"


def _captures_of_alice(kernel: Uprof) -> int:
    """The ``capture.accepted`` entries (what a written capture request records)."""
    kernel.reads.drain()
    return sum(1 for e in kernel.audit_log.entries() if e.entry["action"] == "capture.accepted")


def _capture_after_its_turn(
    server: LiveServer,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
    token: str,
    meanwhile: Any,
) -> httpx.Response:
    """Post a capture while the subject's writer turns are held (another group saving);
    run ``meanwhile`` once the capture waits there; release; the capture's answer."""
    held = threading.Lock()
    arrived = threading.Event()
    app = kernel.capture_service.writer._app
    real = app.writer_turns

    @contextlib.contextmanager
    def turns(subjects: Iterable[UUID]) -> Iterator[None]:
        arrived.set()
        with held, real(subjects):
            yield

    monkeypatch.setattr(app, "writer_turns", turns)
    answers: list[httpx.Response] = []
    with httpx.Client(base_url=server.url, timeout=60) as http:
        held.acquire()  # another group of the subject is saving
        post = threading.Thread(
            target=lambda: answers.append(
                http.post(
                    "/v1/captures",
                    headers=bearer(token),
                    json={"subject": "alice", **interaction(TEXT)},
                )
            )
        )
        post.start()
        try:
            assert arrived.wait(60), "the capture never reached its writer turn"
            meanwhile(http)
        finally:
            held.release()
        post.join(60)
    assert answers, "the capture never answered"
    return answers[0]


def test_a_capture_that_waited_for_its_turn_is_refused_for_a_key_revoked_meanwhile(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug TW: the capture reaches its writer turn with a live key; another process
    revokes the key and the server already refuses it elsewhere; the capture then gets
    its turn. Asked again with the key once it has its turn: 401, nothing written."""
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        grant(http, issued.token)
    before = _captures_of_alice(kernel)

    def revoked_elsewhere(http: httpx.Client) -> None:
        revoke_with_the_cli(settings, issued.info.key_id)
        clock[0] += KEY_CACHE_TTL_S + 0.1  # the server's read of the row has aged
        refused = http.post(
            "/v1/consents/list", headers=bearer(issued.token), json={"subject": "alice"}
        )
        assert refused.status_code == 401, refused.text  # revoked, as the server sees it

    answer = _capture_after_its_turn(server, kernel, monkeypatch, issued.token, revoked_elsewhere)
    assert answer.status_code == 401, answer.text
    assert _captures_of_alice(kernel) == before


def test_held_a_capture_with_a_live_key_is_written_after_its_turn(
    server: LiveServer, kernel: Uprof, keys: ApiKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard of TW's test: the same wait, the key standing: 201, one capture."""
    issued = keys.create(PLANNER)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        grant(http, issued.token)
    before = _captures_of_alice(kernel)

    def still_standing(http: httpx.Client) -> None:
        shown = http.post(
            "/v1/consents/list", headers=bearer(issued.token), json={"subject": "alice"}
        )
        assert shown.status_code == 200, shown.text

    answer = _capture_after_its_turn(server, kernel, monkeypatch, issued.token, still_standing)
    assert answer.status_code == 201, answer.text
    assert _captures_of_alice(kernel) == before + 1
