"""A keyed withdrawal whose first request holds its key's turn longer than the client waits
for an answer (decisions 0159/0163, bug LV), against a real server (uvicorn on loopback).

The server waits up to ``UPROF_REQUEST_IN_PROGRESS_WAIT_S`` (0 to 300 s) for the first
request before it answers 409 ``request_in_progress``; the SDK reads an answer for
``timeout_s`` (30 s by default). With the server's wait the longer of the two, the client
never heard the 409: each send was cut by its read timeout, sent again with the key (its
transport resends), and the call failed as a ``ReadTimeout`` ``TransportError``, which says
nothing of a request in progress, while every abandoned send went on waiting on a server
worker. Now the SDK tells the server how long it waits (``Prefer: wait=N``, RFC 7240, half
its read timeout) and the server waits no longer than that for the first request.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.api.conftest import Apps, LiveServer, grant
from tests.api.test_turn_locks_api import turn_held_until_refused
from uprof.api.deps import preferred_wait_s
from uprof.kernel import Uprof
from uprof.sdk import Client, ConflictError

#: The server's wait for the first request (the setting), longer than the client's
#: read timeout: the relation of 300 s to the SDK's 30 s, made short.
SERVER_WAIT_S = 6.0
CLIENT_TIMEOUT_S = 2.0


def test_a_client_waiting_less_than_the_server_hears_request_in_progress(
    server: LiveServer, http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    """Bug LV: the call ends in ``ConflictError`` ``request_in_progress`` naming its key,
    every send carrying that key, each answered (none cut by the client's timeout), and
    nothing done; once the first request is over, the same key does the withdrawal once."""
    consent_id = grant(http, apps.planner)
    sent: list[tuple[str | None, float]] = []
    answered: list[int] = []
    with turn_held_until_refused(kernel, "w-long") as release:
        store = kernel.idempotency
        assert store is not None
        store.in_progress_wait_s = SERVER_WAIT_S
        with Client(
            server.url, apps.planner, timeout_s=CLIENT_TIMEOUT_S, in_progress_resends=1
        ) as client:
            hooks: dict[str, list[Any]] = client._backend._client.event_hooks  # type: ignore[attr-defined]
            hooks["request"].append(
                lambda r: sent.append((r.headers.get("Idempotency-Key"), time.monotonic()))
            )
            hooks["response"].append(lambda r: answered.append(r.status_code))
            with pytest.raises(ConflictError) as refused:
                client.withdraw_consent("alice", consent_id, erase=True, idempotency_key="w-long")
            assert refused.value.code == "request_in_progress"
            assert refused.value.idempotency_key == "w-long"
            assert [key for key, _ in sent] == ["w-long", "w-long"], sent
            assert answered == [409, 409], answered  # heard, not cut by the read timeout
            consents = kernel.profile("alice").consents
            assert all(c.withdrawn_at is None for c in consents if c.consent_id == consent_id)
            release.set()
        with Client(server.url, apps.planner, timeout_s=60) as client:
            first = client.withdraw_consent(
                "alice", consent_id, erase=True, idempotency_key="w-long"
            )
            again = client.withdraw_consent(
                "alice", consent_id, erase=True, idempotency_key="w-long"
            )
    assert first.consent.withdrawn_at is not None
    assert again == first  # the first answer, replayed: done once


@pytest.mark.parametrize(
    ("prefer", "seconds"),
    [
        ("wait=3", 3.0),
        ("respond-async, WAIT = 7", 7.0),
        ('wait="4"; x=y', 4.0),
        ("wait=0", 0.0),
        ("wait=-5", None),
        ("wait=1.5", None),
        ("wait=1e9", None),
        ("wait=٣", None),  # a digit, but not ASCII
        ("wait=", None),
        ("handling=strict", None),
        ("", None),
        (None, None),
    ],
)
def test_the_prefer_wait_is_read_as_rfc_7240_delta_seconds_or_ignored(
    prefer: str | None, seconds: float | None
) -> None:
    """Anything but whole seconds is ignored (the server's own wait stands); a wait the
    client gives only ever shortens the server's (``min``), never lengthens it."""
    assert preferred_wait_s(prefer) == seconds


def test_a_client_cannot_lengthen_the_servers_wait(
    server: LiveServer, http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    """``Prefer: wait=300`` beside a server wait of 0.2 s: refused after the server's 0.2 s."""
    consent_id = grant(http, apps.planner)
    with turn_held_until_refused(kernel, "w-long-2"):
        headers = {
            "Authorization": f"Bearer {apps.planner}",
            "Idempotency-Key": "w-long-2",
            "Prefer": "wait=300",
        }
        began = time.monotonic()
        answer = http.post(
            "/v1/consents/withdraw",
            headers=headers,
            json={"subject": "alice", "consent_id": consent_id, "erase": True},
        )
        took = time.monotonic() - began
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["code"] == "request_in_progress"
    assert took < 5.0, took


def test_a_short_prefer_wait_is_this_requests_alone_and_this_apps_key_alone(
    server: LiveServer, http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    """Held (review of 0172): ``Prefer: wait=0`` is one request's. Sent four times on the
    server's worker threads, each refused at once; the next request without it, on the
    same workers, still gets the server's whole wait (the context variable is reset, not
    left on a reused thread). Another app sending the same key string with ``wait=0``
    beside the held turn is not refused: keys are per app (the turn is a keyed hash of
    tenant, app and key), so no wait tells one app about another's request."""
    consent_id = grant(http, apps.planner)
    theirs = grant(http, apps.calendar, categories=("schedule",), purposes=("scheduling",))
    body = {"subject": "alice", "consent_id": consent_id, "erase": False}

    def withdraw(key: str, prefer: str | None, consent: dict[str, Any]) -> tuple[int, float]:
        headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": "w-shared"}
        if prefer is not None:
            headers["Prefer"] = prefer
        began = time.monotonic()
        answer = http.post("/v1/consents/withdraw", headers=headers, json=consent)
        return answer.status_code, time.monotonic() - began

    with turn_held_until_refused(kernel, "w-shared"):
        store = kernel.idempotency
        assert store is not None
        store.in_progress_wait_s = 1.5
        quick = [withdraw(apps.planner, "wait=0", body) for _ in range(4)]
        assert [status for status, _ in quick] == [409] * 4, quick
        assert max(took for _, took in quick) < 1.0, quick
        status, took = withdraw(apps.planner, None, body)
        assert status == 409
        assert took >= 1.4, took  # the server's wait, not the previous requests' 0
        other_app = {"subject": "alice", "consent_id": theirs, "erase": False}
        status, _ = withdraw(apps.calendar, "wait=0", other_app)
        assert status == 200  # its own key's turn: free
