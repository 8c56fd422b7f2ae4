"""TF's consent erasure turn (0216) against the client's own wait, on a real server
(uvicorn on loopback, both backends; 0219-review-of-0216-and-tf).

Bug UA: a withdrawal with ``erase`` waits for the consent's erasure turn while another
request of the same consent erases (another server process, a privacy-center "Finish
erasure", a retry sent with a new key) up to ``CONSENT_ERASURE_TURN_WAIT_S`` (60 s),
whatever the client said it waits (``Prefer: wait=N``; the SDK sends half its read
timeout, 15 s by default). The key's own turn honours that wait since bug LV; this one
did not, so the SDK's send was cut by its read timeout and the call failed as a
``ReadTimeout`` that says nothing of another erasure, while the abandoned request went
on waiting on a server worker and then erased. Now it answers 409 ``conflict_retry``
within the client's wait, nothing written."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from tests.api.conftest import Apps, LiveServer, grant, interaction
from tests.kernel.test_consent_erasure_turn_review import wait_until_waiting_for_turn
from uprof.backends import backend_for
from uprof.kernel import Uprof
from uprof.sdk import Client, ConflictError
from uprof.settings import Settings

#: The SDK's read timeout here: it tells the server ``Prefer: wait=2``.
CLIENT_TIMEOUT_S = 4.0


@contextmanager
def erasure_turn_held(kernel: Uprof, consent_id: str) -> Iterator[threading.Event]:
    """Hold the consent's erasure turn (as another request erasing it holds it) in another
    thread, on a lock of its own (a process's, as far as the lock can tell), until the
    test sets the event it yields."""
    name = f"consent-erasure/{kernel.stream_of('alice')}/{consent_id}"
    engine = kernel.views_engine
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with backend_for(engine).named_lock(engine, name, wait_s=0) as got:
            assert got
            held.set()
            release.wait(120)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(30)
    try:
        yield release
    finally:
        release.set()
        holder.join(60)


def _captured(http: httpx.Client, key: str) -> None:
    answer = http.post(
        "/v1/captures",
        headers={"Authorization": f"Bearer {key}"},
        json={"subject": "alice", **interaction("I like green tea")},
    )
    assert answer.status_code in (200, 201, 202), answer.text


def test_ua_a_client_hears_the_other_erasure_within_its_own_wait(
    server: LiveServer, http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    consent_id = grant(http, apps.planner)
    _captured(http, apps.planner)
    assert kernel.wait_until_caught_up(60)
    with erasure_turn_held(kernel, consent_id) as release:
        answered: list[int] = []
        with Client(server.url, apps.planner, timeout_s=CLIENT_TIMEOUT_S) as client:
            hooks: dict[str, list[Any]] = client._backend._client.event_hooks  # type: ignore[attr-defined]
            hooks["response"].append(lambda r: answered.append(r.status_code))
            with pytest.raises(ConflictError) as refused:
                client.withdraw_consent("alice", consent_id, erase=True, idempotency_key="ua-1")
        # One send, answered: not cut by the read timeout and sent again (on main the
        # resend met the first send's key turn: "request_in_progress" of its own key).
        assert answered == [409], answered
        assert refused.value.code == "conflict_retry", refused.value
        # Nothing written by the refused request: the consent is in force.
        assert any(c.consent_id == consent_id for c in kernel.consents_in_force("alice"))
        release.set()
    with Client(server.url, apps.planner, timeout_s=60) as client:
        done = client.withdraw_consent("alice", consent_id, erase=True, idempotency_key="ua-2")
    assert done.consent.withdrawn_at is not None
    assert done.erasure is not None  # the capture erased, by this request


def test_held_a_request_that_says_no_wait_gets_the_turns_whole_wait(
    server: LiveServer, http: httpx.Client, kernel: Uprof, apps: Apps, settings: Settings
) -> None:
    """Without ``Prefer: wait`` (the privacy center, a raw client) the request waits for
    the turn as before: once the other erasure is over it does its own."""
    consent_id = grant(http, apps.planner)
    _captured(http, apps.planner)
    assert kernel.wait_until_caught_up(60)
    answers: list[httpx.Response] = []
    name = f"consent-erasure/{kernel.stream_of('alice')}/{consent_id}"
    with erasure_turn_held(kernel, consent_id) as release:
        sender = threading.Thread(
            target=lambda: answers.append(
                http.post(
                    "/v1/consents/withdraw",
                    headers={"Authorization": f"Bearer {apps.planner}"},
                    json={"subject": "alice", "consent_id": consent_id, "erase": True},
                    timeout=120,
                )
            )
        )
        sender.start()
        hashed = hashlib.sha256(name.encode()).hexdigest()
        wait_until_waiting_for_turn(settings, hashed)  # the request waits for the turn
        assert answers == [], [a.text for a in answers]
        release.set()
        sender.join(120)
    assert len(answers) == 1 and answers[0].status_code == 200, answers[0].text
    assert answers[0].json()["erasure"] is not None
