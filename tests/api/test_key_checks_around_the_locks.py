"""A write's key checks around the write locks: bounded before the lock too (bug WI),
within the client's ``Prefer: wait`` (bug WJ), and a quarantine retry refused partway
says what it released (bug WL).

0231-review-of-0227 and 0232-review-of-0226-and-0231 bounded the key checks asked under
the audit log's and the event store's write locks (``domain.under_lock.asked_within``);
their Left named three gaps. The checks asked *before* the store's lock, in a writer
turn (the capture writer's group check; ``EventStore.with_retry``'s check before each
attempt, which the writer's one-request fallback runs too) had no bound: on the capture
writer's thread a key store that did not answer held every app's captures. The bound
ignored the client's ``Prefer: wait``. A retry of several quarantined captures refused
at the second left the first released, and its 401 did not say so.

SQLite and PostgreSQL, a live server on loopback built as ``uprof serve`` builds it. A
"hung key store" is the server's own ``ApiKeyStore.is_live`` made to wait on an event
for one key (the read a locked ``api_keys`` table, a slow network or an overloaded store
makes; the real lock is ``test_key_store_locked_by_another_process.py``), released at
teardown. No sleep decides anything: each test waits for the hung read to be entered.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import uprof.recorders
from tests.api.conftest import (
    CALENDAR,
    PLANNER,
    LiveServer,
    bearer,
    grant,
    interaction,
    revoke_with_the_cli,
)
from tests.fakes.ports import FakeExtractor
from tests.kernel.poison import MARK, PoisonExtractor
from uprof.api import ApiKeyStore
from uprof.apikeys.store import KEY_CACHE_TTL_S
from uprof.eventstore import CAPTURED_TOPIC
from uprof.kernel import Uprof
from uprof.settings import Settings

#: A generous bound for every wait on an observable condition.
WAIT_S = 60.0
#: The bound of a check (2 s) and a margin for a loaded 2-core machine.
ANSWERED_WITHIN_S = 20.0

#: The threads a write's key check is asked on: the request's own (before any bound),
#: the capture writer's, and the bounded checks' (``domain.under_lock``).
_CHECK_THREADS = ("uprof-capture-writer", "key-check-in-turn", "check-under-lock")


class _HungKey:
    """``is_live`` that, once armed, does not answer for one key (``key_id``) when asked
    on a thread named in ``threads``, until released; every other read is the store's."""

    def __init__(self, keys: ApiKeyStore, key_id: str, threads: tuple[str, ...]) -> None:
        self._is_live = keys.is_live
        self._key_id = key_id
        self._threads = threads
        self.armed = threading.Event()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.hung_on: list[str] = []

    def __call__(self, key_id: str) -> bool:
        here = threading.current_thread().name
        if self.armed.is_set() and key_id == self._key_id and here in self._threads:
            self.hung_on.append(here)
            self.entered.set()
            self.release.wait(WAIT_S * 4)
        return self._is_live(key_id)


@pytest.fixture
def hung_key(keys: ApiKeyStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``hung_key(key_id, threads)`` wraps the server's key store; released at teardown,
    and the hung reads' threads waited for before the store closes under them."""
    made: list[_HungKey] = []

    def hang(key_id: str, threads: tuple[str, ...] = _CHECK_THREADS) -> _HungKey:
        hung = _HungKey(keys, key_id, threads)
        monkeypatch.setattr(keys, "is_live", hung)
        made.append(hung)
        return hung

    try:
        yield hang
    finally:
        for hung in made:
            hung.release.set()
        for thread in threading.enumerate():
            if thread.name in ("key-check-in-turn", "check-under-lock"):
                thread.join(WAIT_S)


def _captured(kernel: Uprof, after: int) -> int:
    return sum(1 for n in kernel.app.notifications_after(after, 1000) if n.topic == CAPTURED_TOPIC)


def _in_background(send: Callable[[], httpx.Response]) -> tuple[threading.Thread, list[Any]]:
    answers: list[Any] = []

    def run() -> None:
        sent = time.monotonic()
        try:
            answers.append((send(), time.monotonic() - sent))
        except httpx.TimeoutException as error:
            answers.append((error, time.monotonic() - sent))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, answers


# --------------------------------------------------------------------------- WI


def test_wi_a_hung_key_read_in_the_capture_writer_does_not_hold_another_apps_captures(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    hung_key: Any,
) -> None:
    """Bug WI: the planner's capture reaches the capture writer, whose check of the
    planner's key (before the store's lock) does not answer. The calendar's capture,
    sent once that read hangs, is written and answered within the bound; the planner's
    is answered 503 and nothing of it written. Before: the writer waited with the read,
    and every app's captures with it."""
    assert kernel.capture_service.writer.running  # the group commit: the attack's road
    planner = keys.create(PLANNER)
    calendar = keys.create(CALENDAR)
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
        grant(http, planner.token)
        grant(http, calendar.token, purposes=("scheduling",))
    before = kernel.app.max_notification_id()
    hung = hung_key(planner.info.key_id)
    hung.armed.set()
    with httpx.Client(base_url=server.url, timeout=ANSWERED_WITHIN_S) as http:
        planner_sent, planner_answer = _in_background(
            lambda: http.post(
                "/v1/captures",
                headers=bearer(planner.token),
                json={"subject": "alice", **interaction("I live in Oslo")},
            )
        )
        assert hung.entered.wait(WAIT_S), "the planner's capture never asked its key"
        calendar_sent, calendar_answer = _in_background(
            lambda: http.post(
                "/v1/captures",
                headers=bearer(calendar.token),
                json={
                    "subject": "alice",
                    **interaction("Dentist on Friday at 9", purpose="scheduling"),
                },
            )
        )
        calendar_sent.join(ANSWERED_WITHIN_S * 2)
        planner_sent.join(ANSWERED_WITHIN_S * 2)
    still_hung = not hung.release.is_set()
    hung.release.set()
    assert still_hung
    answered, took = calendar_answer[0]
    assert isinstance(answered, httpx.Response), (
        f"the calendar's capture was not answered within {took:.1f} s while the planner's "
        f"key read hung on {hung.hung_on}"
    )
    assert answered.status_code == 201, answered.text
    refused, _ = planner_answer[0]
    assert isinstance(refused, httpx.Response), "the planner's capture was never answered"
    assert refused.status_code == 503, refused.text
    assert refused.headers.get("Retry-After")
    assert _captured(kernel, before) == 1  # the calendar's; nothing of the planner's


def test_wi_a_hung_key_read_in_a_writer_turn_is_answered_within_the_bound(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    hung_key: Any,
) -> None:
    """Bug WI, the subject's writer turn (``EventStore.with_retry``, whose check the
    capture writer's one-request fallback asks too): a grant whose key check does not
    answer there is answered 503 within the bound, nothing written; a grant of another
    key for the same subject is written meanwhile."""
    planner = keys.create(PLANNER)
    calendar = keys.create(CALENDAR)
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
        grant(http, planner.token)
    before = len(kernel.profile("alice").consents)
    # The request's own thread too: before, the turn's check ran there, unbounded.
    hung = hung_key(planner.info.key_id, (*_CHECK_THREADS, "AnyIO worker thread"))
    hung.armed.set()
    with httpx.Client(base_url=server.url, timeout=ANSWERED_WITHIN_S) as http:
        sent, answer = _in_background(
            lambda: http.post(
                "/v1/consents",
                headers=bearer(planner.token),
                json={
                    "subject": "alice",
                    "categories": ["preference"],
                    "purposes": ["personalization"],
                    "collected_by": "consent-ui:test",
                },
            )
        )
        assert hung.entered.wait(WAIT_S), "the grant never asked its key"
        grant(http, calendar.token, purposes=("scheduling",))  # the same subject's turn
        sent.join(ANSWERED_WITHIN_S * 2)
    hung.release.set()
    refused, took = answer[0]
    assert isinstance(refused, httpx.Response), (
        f"the grant was not answered within {took:.1f} s while its key read hung"
    )
    assert refused.status_code == 503, refused.text
    assert len(kernel.profile("alice").consents) == before + 1  # the calendar's only


# --------------------------------------------------------------------------- WJ


def _withdraw(http: httpx.Client, token: str, consent_id: str, prefer: str | None) -> Any:
    headers = bearer(token)
    if prefer is not None:
        headers["Prefer"] = prefer
    return http.post(
        "/v1/consents/withdraw",
        headers=headers,
        json={"subject": "alice", "consent_id": consent_id},
    )


def _in_force(kernel: Uprof, consent_id: str) -> bool:
    return any(
        c.consent_id == consent_id and c.withdrawn_at is None
        for c in kernel.profile("alice").consents
    )


def test_wj_a_withdrawal_that_prefers_to_wait_one_second_is_answered_within_it(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    hung_key: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug WJ: a withdrawal sent with ``Prefer: wait=1`` whose key check does not answer
    (in its turn or under the store's lock) is answered 503 within about that second,
    the consent still in force; before, after the server's own bound (made 8 s here so
    that the two cannot be confused on a loaded machine)."""
    monkeypatch.setattr(uprof.recorders, "CHECK_UNDER_LOCK_WITHIN_S", 8.0)
    planner = keys.create(PLANNER)
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
        consent_id = grant(http, planner.token)
        hung = hung_key(planner.info.key_id, ("key-check-in-turn", "check-under-lock"))
        hung.armed.set()
        sent = time.monotonic()
        answer = _withdraw(http, planner.token, consent_id, "wait=1")
        took = time.monotonic() - sent
    assert hung.entered.is_set(), "the withdrawal never asked its key on a bounded thread"
    assert answer.status_code == 503, answer.text
    assert answer.headers.get("Retry-After")
    assert took < 5.0, f"asked to answer within 1 s, answered after {took:.1f} s"
    assert _in_force(kernel, consent_id)


def test_held_a_withdrawal_that_prefers_to_wait_with_a_key_that_answers_is_made(
    server: LiveServer, kernel: Uprof, keys: ApiKeyStore
) -> None:
    """The guard: ``Prefer: wait=1`` and a key store that answers: withdrawn, 200; and
    ``wait=0`` (the wait spent before the check) still lets a check that answers at once
    through (``CHECK_LEAST_WITHIN_S``)."""
    planner = keys.create(PLANNER)
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
        first = grant(http, planner.token)
        second = grant(http, planner.token, categories=("preference",))
        assert _withdraw(http, planner.token, first, "wait=1").status_code == 200
        assert _withdraw(http, planner.token, second, "wait=0").status_code == 200
    assert not _in_force(kernel, first)
    assert not _in_force(kernel, second)


# --------------------------------------------------------------------------- WL


class _SecondModelCallWaits:
    """The retry's extractor: the first capture extracts at once; the second says it
    started and finishes only once the test releases it (a model that takes its time)."""

    def __init__(self, inner: FakeExtractor) -> None:
        self._inner = inner
        self.name = inner.name
        self.calls = 0
        self.started = threading.Event()
        self.release = threading.Event()

    def extract(self, capture: Any) -> Any:
        self.calls += 1
        if self.calls == 2:
            self.started.set()
            assert self.release.wait(WAIT_S), "the test never released the extraction"
        return self._inner.extract(capture)


def _two_quarantined(http: httpx.Client, kernel: Uprof, token: str) -> list[str]:
    """Two captures of alice's the pipeline set aside (the extractor failed every time)."""
    kernel.extraction._extractor = PoisonExtractor(FakeExtractor())
    grant(http, token)
    ids = []
    for town in ("ville", "burg"):
        ack = http.post(
            "/v1/captures",
            headers=bearer(token),
            json={"subject": "alice", **interaction(f"I live in {MARK}{town}")},
        )
        assert ack.status_code == 201, ack.text
        ids.append(str(ack.json()["capture_id"]))
    deadline = time.monotonic() + WAIT_S
    while kernel.lag().quarantined != 2:
        assert time.monotonic() < deadline, "the captures were never quarantined"
        time.sleep(0.05)
    return ids


def _released_on_the_trail(kernel: Uprof) -> list[str]:
    kernel.reads.drain()
    return [
        capture_id
        for e in kernel.audit_log.entries(action="capture.released")
        for capture_id in e.entry.get("event_ids", [])
    ]


def test_wl_a_retry_refused_partway_says_which_captures_it_released(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug WL: a retry of two quarantined captures; the operator key is revoked by
    another process while the second is extracted (the first released by then). The
    401 lists exactly the captures released, which the audit trail's
    ``capture.released`` entries and the quarantine agree with; the second stays held."""
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    operator = keys.create(PLANNER, ["app", "operator"])
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
        first, second = _two_quarantined(http, kernel, operator.token)
    model = _SecondModelCallWaits(FakeExtractor())
    kernel.extraction._extractor = model
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
        sent, answer = _in_background(
            lambda: http.post(
                "/v1/quarantine/retry",
                headers=bearer(operator.token),
                json={"capture_ids": [first, second]},
            )
        )
        try:
            assert model.started.wait(WAIT_S), "the retry never extracted the second capture"
            revoke_with_the_cli(settings, operator.info.key_id)
            clock[0] += KEY_CACHE_TTL_S + 0.1  # the server's read of the row has aged
            seen = http.get("/v1/quarantine", headers=bearer(operator.token))
            assert seen.status_code == 401, seen.text  # revoked, as the server sees it
        finally:
            model.release.set()
        sent.join(WAIT_S)
    refused, _ = answer[0]
    assert refused.status_code == 401, refused.text
    body = refused.json()
    assert body["error"]["code"] == "unauthenticated"
    said = {o["capture_id"]: o["outcome"] for o in body.get("outcomes", [])}
    assert said == {first: "released"}, f"the 401 said {said} of what the retry released"
    assert _released_on_the_trail(kernel) == [first]
    assert [q.capture_id for q in kernel.quarantined()] == [second]
