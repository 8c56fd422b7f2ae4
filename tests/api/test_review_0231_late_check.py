"""A check asked under a lock that answers after its bound changes nothing (bug VX); the
checks left running behind a hung key store are bounded in number (bug VY); a capture
group whose check did not answer is answered at once, not request by request (bug VZ).

0231-review-of-0227 bounds the key check asked under the event store's write lock
(``domain.under_lock.asked_within``): past ``CHECK_UNDER_LOCK_WITHIN_S`` the save is
refused as an outage and the check left to finish on its own thread, "its answer
unused". The capture writer's group check (``capture_writer.keys_still_standing``)
marked each request it found refused (``pending.error``) from that thread: a late answer
landed on a request the writer's fallback had meanwhile written, and the client was
answered 401 for a capture that was stored.

SQLite and PostgreSQL, a live server on loopback built as ``uprof serve`` builds it. The
key store's read is the server's own ``ApiKeyStore.is_live``, made to hang when asked on
the bounded check's thread; the revocation is made through a key store of its own (as
another process's ``uprof apps revoke``: the server's copy of the row is not told).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

import domain.under_lock
import uprof.recorders
from tests.api.conftest import PLANNER, LiveServer, bearer, grant, interaction
from tests.api.test_capture_key_at_the_write import _captures_of_alice
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.settings import Settings

#: A generous bound for every wait on an observable condition.
WAIT_S = 60.0


def _on_the_check_thread() -> bool:
    return threading.current_thread().name == "check-under-lock"


class _LateGroupCheck:
    """``is_live`` whose first read on the bounded check's thread (the group's check)
    hangs; the writer's fallback then reads the key (live), the key is revoked by
    another store, and the fallback's own bounded check answers from the row it just
    read. Only then is the group's read let go (it reads the row, revoked) and waited
    for: its answer is as late as it can be, before the fallback's commit."""

    def __init__(self, keys: ApiKeyStore, revoke: ApiKeyStore, key_id: str) -> None:
        self._is_live = keys.is_live
        self._revoke = revoke
        self._key_id = key_id
        self.armed = threading.Event()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.revoked = threading.Event()
        self._hung: threading.Thread | None = None

    def __call__(self, key_id: str) -> bool:
        if not self.armed.is_set():
            return self._is_live(key_id)
        if _on_the_check_thread() and not self.entered.is_set():
            self._hung = threading.current_thread()
            self.entered.set()
            self.release.wait(WAIT_S * 2)
            # The hung read was past the server's copy of the row, at the database: it
            # answers what the table holds when it is let go (another store reads it).
            return self._revoke.is_live(key_id)
        live = self._is_live(key_id)
        if self.entered.is_set() and not _on_the_check_thread() and not self.revoked.is_set():
            # The fallback's own read, on the writer thread: the key stood; revoked now.
            assert self._revoke.revoke(self._key_id)
            self.revoked.set()
        elif self.revoked.is_set() and _on_the_check_thread() and self._hung is not None:
            # The fallback's check under the lock: the group's late answer lands now.
            self.release.set()
            self._hung.join(WAIT_S)
        return live

    def join(self) -> None:
        """Wait for the hung read's thread to have finished (its answer landed)."""
        if self._hung is not None:
            self._hung.join(WAIT_S)


@pytest.fixture
def other_keys(settings: Settings) -> Iterator[ApiKeyStore]:
    """The same key store opened again: another process's ``uprof apps revoke``."""
    store = ApiKeyStore.open(settings)
    try:
        yield store
    finally:
        store.close()


def test_vx_a_late_group_check_does_not_refuse_a_capture_the_fallback_wrote(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    other_keys: ApiKeyStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug VX: the group's check times out (503 for the group, left running); the
    fallback writes the capture; the group's late answer (the key revoked meanwhile)
    must not turn the written capture's answer into a refusal."""
    assert kernel.capture_service.writer.running  # the group commit: the attack's road
    issued = keys.create(PLANNER)
    late = _LateGroupCheck(keys, other_keys, issued.info.key_id)
    monkeypatch.setattr(keys, "is_live", late)
    with httpx.Client(base_url=server.url, timeout=WAIT_S * 2) as http:
        grant(http, issued.token, "alice")
        before = _captures_of_alice(kernel)
        late.armed.set()
        answered = http.post(
            "/v1/captures",
            headers=bearer(issued.token),
            json={"subject": "alice", **interaction("I live in Lisbon")},
        )
    late.release.set()
    assert late.entered.is_set(), "the group never asked its key on the bounded thread"
    late.join()  # the late answer has landed: whatever it could change, it has
    written = _captures_of_alice(kernel) - before
    # Written and 201; or refused (the key revoked: 401; the key store hung: 503) and
    # nothing written.
    assert (answered.status_code, written) in {(201, 1), (401, 0), (503, 0)}, (
        f"answered {answered.status_code} with {written} capture(s) written: {answered.text[-300:]}"
    )


def test_vx_the_group_check_marks_no_request() -> None:
    """Bug VX, the contract: the group's check says a refusal by raising, and marks no
    request: its answer may land after the bound, on requests answered or written since."""
    from domain.errors import PermissionDeniedError
    from uprof.services.capture_writer import PendingCapture, keys_still_standing

    def revoked() -> None:
        raise PermissionError("the key was revoked")

    pending = PendingCapture(
        interactions=(),
        batch_token=None,
        token_window_s=0.0,
        principal=None,
        still_authenticated=revoked,
    )
    with pytest.raises(PermissionDeniedError):
        keys_still_standing([pending])
    assert pending.error is None


class _HungKeyStore:
    """``is_live`` that does not answer on the bounded check's thread until released
    (counts the reads it holds)."""

    def __init__(self, keys: ApiKeyStore) -> None:
        self._is_live = keys.is_live
        self.armed = threading.Event()
        self.entered = threading.Event()
        self.release = threading.Event()
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        with self._lock:
            return self._held

    def __call__(self, key_id: str) -> bool:
        if self.armed.is_set() and _on_the_check_thread():
            with self._lock:
                self._held += 1
            self.entered.set()
            try:
                self.release.wait(WAIT_S * 4)
            finally:
                with self._lock:
                    self._held -= 1
        return self._is_live(key_id)


def _checks_alive() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "check-under-lock")


def _let_the_checks_end(hung: _HungKeyStore) -> None:
    """Release the hung reads and wait for their threads, before the key store closes
    under them (a read's connection would be left open)."""
    hung.release.set()
    for thread in [t for t in threading.enumerate() if t.name == "check-under-lock"]:
        thread.join(WAIT_S)


def test_vy_checks_left_behind_a_hung_key_store_are_bounded(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug VY: each write refused past the bound left a thread waiting on the hung key
    store, one per write, for as long as the store hung. Many writes (more than the
    bound on such threads) leave at most that many, and each is refused 503."""
    bound = getattr(domain.under_lock, "MAX_CHECKS_LEFT_RUNNING", 16)
    writes = bound + 8
    # A short bound on the check (the lock is held for it) keeps the attack short.
    monkeypatch.setattr(uprof.recorders, "CHECK_UNDER_LOCK_WITHIN_S", 0.2)
    hung = _HungKeyStore(keys)
    monkeypatch.setattr(keys, "is_live", hung)
    token = keys.create(PLANNER).token
    statuses: list[int] = []
    try:
        with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
            grant(http, token, "alice")
            hung.armed.set()
            for _ in range(writes):
                statuses.append(
                    http.post(
                        "/v1/consents",
                        headers=bearer(token),
                        json={
                            "subject": "alice",
                            "categories": ["preference"],
                            "purposes": ["personalization"],
                            "collected_by": "consent-ui:test",
                        },
                    ).status_code
                )
        left_running = _checks_alive()
        held = hung.held
    finally:
        _let_the_checks_end(hung)
    assert statuses == [503] * writes, statuses
    assert held >= 1, "no check ever reached the hung key store"
    assert left_running <= bound, f"{left_running} checks left running for {writes} writes"
    assert len(kernel.profile("alice").consents) == 1  # the refused grants wrote nothing


def test_vz_a_capture_group_whose_check_did_not_answer_is_answered_within_the_bound(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug VZ: a group whose key check did not answer was written request by request,
    each asking its key alone under the lock again: with the key store hung, the n-th
    request of the group waited n bounds (up to 64 x 2 s). Every request is answered
    503 within a few bounds of being sent, and nothing is written."""
    within_s = 4.0  # a longer bound: the group forms behind the first request meanwhile
    monkeypatch.setattr(uprof.recorders, "CHECK_UNDER_LOCK_WITHIN_S", within_s)
    answered_within_s = 3 * within_s + 8
    requests = 12
    hung = _HungKeyStore(keys)
    monkeypatch.setattr(keys, "is_live", hung)
    token = keys.create(PLANNER).token
    answers: list[tuple[int, float]] = []
    lock = threading.Lock()

    def capture(n: int) -> None:
        sent = time.monotonic()
        with httpx.Client(base_url=server.url, timeout=WAIT_S * 4) as http:
            status = http.post(
                "/v1/captures",
                headers=bearer(token),
                json={"subject": "alice", **interaction(f"note {n}")},
            ).status_code
        with lock:
            answers.append((status, time.monotonic() - sent))

    try:
        with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
            grant(http, token, "alice")
        before = _captures_of_alice(kernel)
        hung.armed.set()
        first = threading.Thread(target=capture, args=(0,), daemon=True)
        first.start()
        assert hung.entered.wait(WAIT_S), "the first capture never asked its key under the lock"
        rest = [
            threading.Thread(target=capture, args=(n,), daemon=True) for n in range(1, requests + 1)
        ]
        for t in rest:
            t.start()
        for t in [first, *rest]:
            t.join(WAIT_S * 4)
    finally:
        _let_the_checks_end(hung)
    assert len(answers) == requests + 1, answers
    assert {status for status, _ in answers} == {503}, answers
    slowest = max(took for _, took in answers)
    assert slowest <= answered_within_s, (
        f"a capture was answered after {slowest:.1f} s (bound {within_s:g} s each): "
        f"{sorted(round(took, 1) for _, took in answers)}"
    )
    assert _captures_of_alice(kernel) == before  # nothing written
