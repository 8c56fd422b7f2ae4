"""A capture committed on its own request thread (``UPROF_GROUP_COMMIT=false``, docs/api.md)
is written only for a key that still stands when it has its subject's writer turn
(SQLite and PostgreSQL, a live server, the key revoked by ``uprof apps revoke`` in a
process of its own).

0218-key-rechecked-at-the-write (bug TW) asks the key again in the capture writer
(``capture_writer.still_standing``) and in its one-request fallback; a server that does
not group commits saves each capture through ``CaptureService._save_one`` in the
subject's writer turn (``EventStore.with_retry``), which did not ask it: a key revoked
while the capture waited there, and already refused by the server elsewhere, had its
capture written, 201 (bug UJ).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx
import pytest

from tests.api.conftest import (
    PLANNER,
    LiveServer,
    api_settings,
    bearer,
    build_kernel,
    grant,
    interaction,
    revoke_with_the_cli,
)
from tests.api.test_capture_key_at_the_write import TEXT, _captures_of_alice
from tests.conftest import Backend
from uprof.api import ApiKeyStore
from uprof.apikeys.store import KEY_CACHE_TTL_S
from uprof.kernel import Uprof
from uprof.server import create_server
from uprof.settings import Settings

T = TypeVar("T")
WAIT_S = 60


@pytest.fixture
def settings(backend: Backend) -> Settings:
    """A server that commits each capture on its request thread."""
    return api_settings(backend, background=True).model_copy(update={"group_commit": False})


@pytest.fixture
def server(kernel: Uprof, keys: ApiKeyStore) -> Iterator[LiveServer]:
    assert not kernel.capture_service.writer.running  # no group commit: the attack's road
    with LiveServer(create_server(kernel, keys, max_body_bytes=64_000)) as live:
        yield live


def _capture_after_its_turn(
    server: LiveServer,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
    token: str,
    meanwhile: Callable[[httpx.Client], None],
    *,
    idempotency_key: str | None = None,
) -> httpx.Response:
    """Post a capture while its subject's writer turn is held (another writer of the
    subject saving); run ``meanwhile`` once the capture waits there; release it."""
    headers = bearer(token)
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    held = threading.Lock()
    arrived = threading.Event()
    app = kernel.capture_service._app
    real = app.with_retry

    def with_retry(command: Callable[[], T], *, subject: Any = None, **options: Any) -> T:
        if subject is not None:  # the capture's save, in its subject's writer turn
            arrived.set()
            with held:
                return real(command, subject=subject, **options)
        return real(command, subject=subject, **options)

    monkeypatch.setattr(app, "with_retry", with_retry)
    answers: list[httpx.Response] = []
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
        held.acquire()
        post = threading.Thread(
            target=lambda: answers.append(
                http.post(
                    "/v1/captures",
                    headers=headers,
                    json={"subject": "alice", **interaction(TEXT)},
                )
            )
        )
        post.start()
        try:
            assert arrived.wait(WAIT_S), "the capture never reached its writer turn"
            meanwhile(http)
        finally:
            held.release()
        post.join(WAIT_S)
    assert answers, "the capture never answered"
    return answers[0]


def test_uj_a_capture_on_its_own_thread_is_refused_for_a_key_revoked_while_it_waited(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug UJ: without group commit, the capture reaches its subject's writer turn with a
    live key; another process revokes the key and the server refuses it elsewhere; the
    capture then gets its turn. Asked again there: 401, nothing written."""
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER)
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
        grant(http, issued.token)
    before = _captures_of_alice(kernel)

    def revoked_elsewhere(http: httpx.Client) -> None:
        revoke_with_the_cli(settings, issued.info.key_id)
        clock[0] += KEY_CACHE_TTL_S + 0.1  # the server's read of the row has aged
        refused = http.post(
            "/v1/consents/list", headers=bearer(issued.token), json={"subject": "alice"}
        )
        assert refused.status_code == 401, refused.text

    answer = _capture_after_its_turn(server, kernel, monkeypatch, issued.token, revoked_elsewhere)
    assert answer.status_code == 401, answer.text
    assert _captures_of_alice(kernel) == before


def test_held_a_capture_on_its_own_thread_with_a_live_key_is_written_after_its_turn(
    server: LiveServer, kernel: Uprof, keys: ApiKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard of UJ's test: the same wait, the key standing: 201, one capture."""
    issued = keys.create(PLANNER)
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
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


def test_uj_the_writers_fallback_asks_the_key_in_the_turn_it_waited_for(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bug UJ, the group writer's road: a group that keeps losing (another process's
    writer saving the subject first, twice) is written request by request
    (``CaptureService._write_alone``), each in its subject's writer turn. 0218 asked the
    key before that turn, not in it: a key revoked while the request waited there had
    its capture written, 201. Asked in the turn: 401, nothing written."""
    from domain.errors import VersionConflictError

    settings = api_settings(backend, background=True)
    kernel = build_kernel(settings)
    keys = ApiKeyStore.open(settings)
    try:
        with LiveServer(create_server(kernel, keys, max_body_bytes=64_000)) as live:
            writer = kernel.capture_service.writer
            assert writer.running  # group commit: the fallback is the writer's
            clock = [1000.0]
            monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
            issued = keys.create(PLANNER)
            with httpx.Client(base_url=live.url, timeout=WAIT_S) as http:
                grant(http, issued.token)
            before = _captures_of_alice(kernel)
            lost: list[int] = []

            def loses(group: list[Any]) -> Any:
                lost.append(len(group))
                raise VersionConflictError("another process saved the subject first")

            monkeypatch.setattr(writer, "_write_group", loses)

            def revoked_elsewhere(http: httpx.Client) -> None:
                revoke_with_the_cli(settings, issued.info.key_id)
                clock[0] += KEY_CACHE_TTL_S + 0.1
                refused = http.post(
                    "/v1/consents/list", headers=bearer(issued.token), json={"subject": "alice"}
                )
                assert refused.status_code == 401, refused.text

            answer = _capture_after_its_turn(
                live, kernel, monkeypatch, issued.token, revoked_elsewhere
            )
            assert lost, "the group never lost: the fallback was not the road"
            assert answer.status_code == 401, answer.text
            assert _captures_of_alice(kernel) == before
    finally:
        keys.close()
        kernel.close()
