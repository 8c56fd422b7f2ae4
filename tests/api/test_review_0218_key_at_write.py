"""Review of 0218-key-rechecked-at-the-write and 0219-review-of-0216-and-tf by attack
(SQLite and PostgreSQL, a live server; keys revoked by ``uprof apps revoke`` in a
process of its own, the server's read of the key row aged past ``KEY_CACHE_TTL_S``).

- A capture *group* in which one request's key is revoked while it waits and the
  others' are not: the refusal is that request's alone.
- The key's check meeting a store outage (the key store not answering when the key is
  asked again at the write): an outage (503), nothing written.
- ``Prefer: wait=0`` and a wait too large for a float against ``client_wait_left``.
- An idempotent replay of a write whose key was revoked after its first run: the docs
  promise "a retry is decided again ... its key must be live (401)", and the same app's
  other key gets the first answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.api.conftest import PLANNER, LiveServer, bearer, grant, interaction, revoke_with_the_cli
from tests.api.test_capture_key_at_the_write import _captures_of_alice
from uprof.api import ApiKeyStore
from uprof.apikeys.store import KEY_CACHE_TTL_S
from uprof.kernel import Uprof
from uprof.settings import Settings

WAIT_S = 60


def _outage() -> sa.exc.OperationalError:
    """What the driver raises when the database does not answer."""
    return sa.exc.OperationalError(
        "SELECT api_keys", {}, ConnectionError("server closed the connection unexpectedly")
    )


def _post_capture(http: httpx.Client, token: str, text: str, **headers: str) -> httpx.Response:
    return http.post(
        "/v1/captures",
        headers={**bearer(token), **headers},
        json={"subject": "alice", **interaction(text)},
    )


def _until(condition: Callable[[], bool], what: str) -> None:
    """Wait for an observable condition, with a generous bound."""
    done = threading.Event()
    for _ in range(WAIT_S * 100):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError(f"never: {what}")


def test_held_a_revoked_key_in_a_capture_group_refuses_its_own_request_alone(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Held (0218's TW attacked in a group): two captures of one subject queued behind
    a group being written form the next group; one's key is revoked by another process
    meanwhile. The revoked one is refused 401 and writes nothing; the other is written
    once, 201; the writer goes on (a later capture is written)."""
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    first, revoked, standing = (keys.create(PLANNER) for _ in range(3))
    writer = kernel.capture_service.writer
    real_commit = writer.commit
    release = threading.Event()
    in_first_group = threading.Event()
    sizes: list[int] = []

    def commit(group: list[Any]) -> None:
        sizes.append(len(group))
        if len(sizes) == 1:
            in_first_group.set()
            assert release.wait(WAIT_S), "the test never let the first group through"
        real_commit(group)

    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
        grant(http, first.token)
        before = _captures_of_alice(kernel)
        monkeypatch.setattr(writer, "commit", commit)
        answers: dict[str, httpx.Response] = {}

        def send(name: str, token: str) -> threading.Thread:
            def post() -> None:
                answers[name] = _post_capture(http, token, f"I live in {name}")

            thread = threading.Thread(target=post)
            thread.start()
            return thread

        threads = [send("first", first.token)]
        try:
            assert in_first_group.wait(WAIT_S), "the first capture never reached the writer"
            threads += [send("revoked", revoked.token), send("standing", standing.token)]
            _until(lambda: writer._queue.qsize() == 2, "both captures queued")
            revoke_with_the_cli(settings, revoked.info.key_id)
            clock[0] += KEY_CACHE_TTL_S + 0.1  # the server's reads of the rows have aged
            seen = http.post(
                "/v1/consents/list", headers=bearer(revoked.token), json={"subject": "alice"}
            )
            assert seen.status_code == 401, seen.text  # revoked, as the server sees it
        finally:
            release.set()
            for thread in threads:
                thread.join(WAIT_S)
        assert sizes[:2] == [1, 2], sizes  # the two queued captures were one group
        assert answers["first"].status_code == 201, answers["first"].text
        assert answers["revoked"].status_code == 401, answers["revoked"].text
        assert answers["standing"].status_code == 201, answers["standing"].text
        assert _captures_of_alice(kernel) == before + 2
        later = _post_capture(http, standing.token, "I live in Porto")
        assert later.status_code == 201, later.text
        assert _captures_of_alice(kernel) == before + 3


def test_held_the_key_store_down_when_a_capture_asks_its_key_again_is_an_outage(
    server: LiveServer, kernel: Uprof, keys: ApiKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held: the key asked again on the capture writer's thread and the key store not
    answering: 503 (an outage, not a 500 and not the capture written), nothing written;
    once it answers again the same capture is written."""
    issued = keys.create(PLANNER)
    real = keys.is_live
    asked_on_writer: list[str] = []

    def is_live(key_id: str) -> bool:
        # The writer asks it on a bounded thread of its own since bug WI.
        if threading.current_thread().name in ("uprof-capture-writer", "key-check-in-turn"):
            asked_on_writer.append(key_id)
            raise _outage()
        return real(key_id)

    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
        grant(http, issued.token)
        before = _captures_of_alice(kernel)
        monkeypatch.setattr(keys, "is_live", is_live)
        down = _post_capture(http, issued.token, "I live in Lisbon")
        assert asked_on_writer, "the writer never asked the key"  # the attack reached it
        assert down.status_code == 503, down.text
        assert _captures_of_alice(kernel) == before
        monkeypatch.setattr(keys, "is_live", real)
        up = _post_capture(http, issued.token, "I live in Lisbon")
        assert up.status_code == 201, up.text
        assert _captures_of_alice(kernel) == before + 1


def test_held_the_key_store_down_when_a_consent_asks_its_key_again_is_an_outage(
    server: LiveServer, kernel: Uprof, keys: ApiKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held: a consent grant whose key check (in the subject's writer turn) meets the key
    store down: 503, no consent granted."""
    issued = keys.create(PLANNER)
    real = keys.is_live
    asked: list[str] = []

    def is_live(key_id: str) -> bool:
        asked.append(key_id)
        raise _outage()

    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
        grant(http, issued.token)
        before = len(kernel.consents_in_force("alice"))
        monkeypatch.setattr(keys, "is_live", is_live)
        down = http.post(
            "/v1/consents",
            headers=bearer(issued.token),
            json={
                "subject": "alice",
                "categories": ["*"],
                "purposes": ["personalization"],
                "collected_by": "consent-ui:second",
            },
        )
        assert asked, "the key was never asked again"
        assert down.status_code == 503, down.text
        monkeypatch.setattr(keys, "is_live", real)
    assert len(kernel.consents_in_force("alice")) == before


@pytest.mark.parametrize("prefer", ["wait=0", "wait=" + "9" * 400])
def test_held_prefer_wait_zero_or_beyond_a_float_still_erases_when_nobody_else_does(
    server: LiveServer, kernel: Uprof, keys: ApiKeyStore, prefer: str
) -> None:
    """Held (0219's UA, ``client_wait_left``): ``Prefer: wait=0`` takes each turn with one
    try (nobody holds them: it erases), and a wait of 400 digits (a float's infinity)
    is the server's own wait, not an overflow: both 200 with a receipt."""
    issued = keys.create(PLANNER)
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
        consent_id = grant(http, issued.token)
        assert _post_capture(http, issued.token, "I like green tea").status_code == 201
        assert kernel.wait_until_caught_up(WAIT_S)
        done = http.post(
            "/v1/consents/withdraw",
            headers={**bearer(issued.token), "Prefer": prefer, "Idempotency-Key": "w-1"},
            json={"subject": "alice", "consent_id": consent_id, "erase": True},
        )
    assert done.status_code == 200, done.text
    assert done.json()["erasure"] is not None


def test_held_a_replay_after_its_key_was_revoked_is_refused_and_the_apps_other_key_gets_it(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Held (docs/api.md, "A retry is decided again ... its key must be live (401)"; keys
    are per app): a keyed capture written, then its key revoked by another process. Its
    replay with the revoked key: 401, nothing written. The same request with the same
    app's other key: the first answer (same capture id, ``Idempotent-Replayed``),
    nothing captured again."""
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    revoked, other = keys.create(PLANNER), keys.create(PLANNER)
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
        grant(http, other.token)
        first = _post_capture(http, revoked.token, "I live in Lisbon", **{"Idempotency-Key": "r-1"})
        assert first.status_code == 201, first.text
        before = _captures_of_alice(kernel)
        revoke_with_the_cli(settings, revoked.info.key_id)
        clock[0] += KEY_CACHE_TTL_S + 0.1
        refused = _post_capture(
            http, revoked.token, "I live in Lisbon", **{"Idempotency-Key": "r-1"}
        )
        assert refused.status_code == 401, refused.text
        again = _post_capture(http, other.token, "I live in Lisbon", **{"Idempotency-Key": "r-1"})
    assert again.status_code == 201, again.text
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.json()["capture_id"] == first.json()["capture_id"]
    assert _captures_of_alice(kernel) == before


def test_held_an_mcp_capture_that_waited_for_its_turn_is_refused_for_a_key_revoked_meanwhile(
    kernel: Uprof, keys: ApiKeyStore, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held (0218 said MCP was not attacked): MCP over HTTP, the ``capture`` tool waits for
    its subject's writer turn (another group saving); the key is revoked by another process
    and the server refuses it on another request; the capture then gets its turn: the
    tool answers ``unauthenticated`` and nothing is written."""
    from tests.api.mcp_messages import ACCEPT, HELLO
    from uprof.api.runtime import ServiceRuntime
    from uprof.mcp import build_server

    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER)
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    before = _captures_of_alice(kernel)
    runtime = ServiceRuntime.for_kernel(kernel)
    app = build_server(runtime, keys).streamable_http_app(streamable_http_path="/mcp")
    writer_app = kernel.capture_service.writer._app
    real_turns = writer_app.writer_turns
    held, arrived = threading.Lock(), threading.Event()

    import contextlib

    @contextlib.contextmanager
    def turns(subjects: Any) -> Any:
        arrived.set()
        with held, real_turns(subjects):
            yield

    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {
            "name": "capture",
            "arguments": {
                "subject": "alice",
                "agent_id": "agent:one",
                "user_input": "I live in Lisbon",
                "occurred_at": "2025-01-01T09:00:00+00:00",
            },
        },
    }
    runtime.start()
    try:
        with LiveServer(app) as live, httpx.Client(timeout=WAIT_S) as http:
            opened = http.post(
                f"{live.url}/mcp", json=HELLO, headers={**ACCEPT, **bearer(issued.token)}
            )
            assert opened.status_code == 200, opened.text
            session = {
                **ACCEPT,
                **bearer(issued.token),
                "mcp-session-id": opened.headers["mcp-session-id"],
            }
            monkeypatch.setattr(writer_app, "writer_turns", turns)
            answers: list[httpx.Response] = []
            held.acquire()
            sender = threading.Thread(
                target=lambda: answers.append(
                    http.post(f"{live.url}/mcp", json=call, headers=session)
                )
            )
            sender.start()
            try:
                assert arrived.wait(WAIT_S), "the capture never reached its writer turn"
                revoke_with_the_cli(settings, issued.info.key_id)
                clock[0] += KEY_CACHE_TTL_S + 0.1
                seen = http.post(
                    f"{live.url}/mcp", json=HELLO, headers={**ACCEPT, **bearer(issued.token)}
                )
                assert seen.status_code == 401, seen.text  # revoked, as the server sees it
            finally:
                held.release()
            sender.join(WAIT_S)
    finally:
        runtime.stop()
    assert answers and answers[0].status_code == 200, answers
    assert "unauthenticated" in answers[0].text, answers[0].text
    assert '"isError":true' in answers[0].text.replace(" ", ""), answers[0].text
    assert _captures_of_alice(kernel) == before


def test_held_the_key_store_down_when_a_policy_change_asks_its_key_again_is_an_outage(
    server: LiveServer, kernel: Uprof, keys: ApiKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held (0218's TU, REST's policy routes now on ``Scope``): the key asked again behind
    the policy's write lock and the key store not answering: 503, the policy unchanged."""
    issued = keys.create(PLANNER, ["app", "operator"])
    asked: list[str] = []

    def is_live(key_id: str) -> bool:
        asked.append(key_id)
        raise _outage()

    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
        before = http.get("/v1/policy", headers=bearer(issued.token))
        assert before.status_code == 200, before.text
        monkeypatch.setattr(keys, "is_live", is_live)
        down = http.post(
            "/v1/policy/grant",
            headers=bearer(issued.token),
            json={"app_id": "app:calendar", "role": "role:assistant"},
        )
        assert asked, "the key was never asked again"
        assert down.status_code == 503, down.text
        monkeypatch.undo()
        after = http.get("/v1/policy", headers=bearer(issued.token))
    assert after.status_code == 200, after.text
    assert after.json()["version"] == before.json()["version"]
