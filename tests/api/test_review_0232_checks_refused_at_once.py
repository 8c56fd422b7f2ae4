"""Held (0236-review-of-0232): a check refused at once because
``MAX_CHECKS_LEFT_RUNNING`` checks still wait on a hung store (bug VY of
0232-review-of-0226-and-0231) is an outage on every door of a live server, for every
app alike, and leaves the store's lock and the capture writer consistent.

SQLite and PostgreSQL, a live server on loopback in this process (the semaphore is the
process's). The hung store is ``MAX_CHECKS_LEFT_RUNNING`` checks asked here that wait on
an event, released before the end.
"""

from __future__ import annotations

import threading

import httpx
import pytest

import domain.under_lock as under_lock
from domain.errors import CheckUnansweredError
from tests.api.conftest import CALENDAR, PLANNER, LiveServer, bearer, grant, interaction
from tests.api.test_capture_key_at_the_write import _captures_of_alice
from uprof.api import ApiKeyStore
from uprof.api.errors import STORE_UNAVAILABLE_RETRY_AFTER_S
from uprof.kernel import Uprof
from uprof.sdk import Client, ServiceUnavailableError

#: A generous bound for every wait on an observable condition.
WAIT_S = 60.0


def _checks_alive() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "check-under-lock")


def _take_every_slot(release: threading.Event) -> None:
    """Every slot taken by a check waiting on a hung store until ``release``."""
    for _ in range(under_lock.MAX_CHECKS_LEFT_RUNNING):
        with pytest.raises(CheckUnansweredError):
            under_lock.asked_within(lambda: release.wait(WAIT_S * 2), 0.01)


def _let_the_checks_end(release: threading.Event) -> None:
    release.set()
    for thread in [t for t in threading.enumerate() if t.name == "check-under-lock"]:
        thread.join(WAIT_S)


def test_held_a_check_refused_at_once_is_every_apps_503_and_leaves_the_writer_whole(
    server: LiveServer, kernel: Uprof, keys: ApiKeyStore
) -> None:
    """Two apps' captures and a consent grant while every slot is taken: 503
    ``store_unavailable`` with ``Retry-After`` over REST and the SDK's
    ``ServiceUnavailableError`` with its wait (never 401 or 500), no thread started,
    nothing written. Once the hung checks answer, both apps' captures are written: the
    refused groups left no lock held and no request of theirs behind."""
    planner, calendar = keys.create(PLANNER).token, keys.create(CALENDAR).token
    hung = threading.Event()
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
        grant(http, planner, "alice")
        grant(http, calendar, "bob", purposes=("scheduling",))
        try:
            _take_every_slot(hung)
            before, alive = _captures_of_alice(kernel), _checks_alive()
            refused = [
                http.post(
                    "/v1/captures",
                    headers=bearer(planner),
                    json={"subject": "alice", **interaction("I live in Lisbon")},
                ),
                http.post(
                    "/v1/captures",
                    headers=bearer(calendar),
                    json={"subject": "bob", **interaction("Dentist at 9", purpose="scheduling")},
                ),
                http.post(
                    "/v1/consents",
                    headers=bearer(planner),
                    json={
                        "subject": "carol",
                        "categories": ["*"],
                        "purposes": ["personalization"],
                        "collected_by": "consent-ui:test",
                    },
                ),
            ]
            with Client(server.url, planner, write_retries=0) as sdk:
                with pytest.raises(ServiceUnavailableError) as by_sdk:
                    sdk.capture("alice", agent_id="agent:one", user_input="I live in Porto")
            assert _checks_alive() == alive  # refused without a thread
            assert _captures_of_alice(kernel) == before  # nothing written
        finally:
            _let_the_checks_end(hung)
        written = [
            http.post(
                "/v1/captures",
                headers=bearer(planner),
                json={"subject": "alice", **interaction("I live in Faro")},
            ).status_code,
            http.post(
                "/v1/captures",
                headers=bearer(calendar),
                json={"subject": "bob", **interaction("Dentist at 10", purpose="scheduling")},
            ).status_code,
        ]
    for answer in refused:
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "store_unavailable", answer.text
        assert answer.headers.get("Retry-After") == str(STORE_UNAVAILABLE_RETRY_AFTER_S)
    assert by_sdk.value.code == "store_unavailable"
    assert by_sdk.value.retry_after_s == STORE_UNAVAILABLE_RETRY_AFTER_S
    assert written == [201, 201]
