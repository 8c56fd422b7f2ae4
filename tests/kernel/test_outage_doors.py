"""Outages and bad text seen through the kernel's own doors (leftovers of 0181, 0182 and
0184), on SQLite and PostgreSQL: each test failed on main before its fix, or says it held.

- ON: ``domain.values.check_text`` (capture's text check) refused NUL only; a lone
  surrogate handed to the kernel's ``capture_many`` raised ``UnicodeEncodeError``.
- OM: during an outage each look at the policy store may wait ~22 s (eventsourcing's ten
  tries of the pool's 2 s wait, bug NK); the look was remembered from when it *started*,
  so the request queued behind it looked again (another 22 s), and every request of the
  process waited behind the first.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest

from domain.errors import InvalidInputError
from domain.values import Interaction
from policies.authorizer import packaged_model_text
from tests.kernel.conftest import consent, say
from uprof.eventstore import CAPTURED_TOPIC
from uprof.kernel import Uprof
from uprof.services.policy import StoredPolicyAuthorizer

LONE = "caf\udce9"  # a byte that is not UTF-8 (0xE9), as Python reads it: a lone surrogate


def _captures(kernel: Uprof) -> int:
    return len(kernel.app.notifications_after(0, 100_000, [CAPTURED_TOPIC]))


@pytest.mark.parametrize(
    "field", ["user_input", "agent_response", "actor", "source_ref", "session_id"]
)
def test_a_lone_surrogate_handed_to_capture_many_is_refused_naming_its_field(
    kernel: Uprof, field: str
) -> None:
    """Bug ON: the kernel's capture check refused NUL only, so a lone surrogate in any
    text field of an ``Interaction`` (embedded code, an import reading bytes that are not
    UTF-8) reached the event's encoding and raised ``UnicodeEncodeError``, naming no
    field. Now one ``InvalidInputError`` naming the field (0181's ``text_problem``), and
    nothing written."""
    consent(kernel)
    before = (_captures(kernel), kernel.audit_log.size())
    bad = replace(say("I like tea"), **{field: LONE})
    with pytest.raises(InvalidInputError) as refused:
        kernel.capture_many("alice", [bad])
    assert refused.value.field == field
    assert "lone surrogates" in str(refused.value)
    assert (_captures(kernel), kernel.audit_log.size()) == before


def test_a_lone_surrogate_in_a_batch_names_its_record_and_writes_nothing(kernel: Uprof) -> None:
    """Bug ON, in a batch: the second record's field is named, the first is not written."""
    consent(kernel)
    before = (_captures(kernel), kernel.audit_log.size())
    batch: list[Interaction] = [say("I like tea"), say(f"I like {LONE}")]
    with pytest.raises(InvalidInputError) as refused:
        kernel.capture_many("alice", batch)
    assert refused.value.field == "interactions.1.user_input"
    assert (_captures(kernel), kernel.audit_log.size()) == before


def test_nul_is_still_refused_as_before(kernel: Uprof) -> None:
    """Held: NUL keeps its own message (docs and clients match on it)."""
    consent(kernel)
    with pytest.raises(InvalidInputError, match="must not contain NUL characters"):
        kernel.capture_many("alice", [say("tea\x00")])


# --- OM: a failed look at the policy store is remembered from when it answered -----------------


class _Store:
    """A policy store whose looks take ``look_s`` of the test's clock and fail while
    ``down``; ``gate``, when set, holds a look until it opens (a look in flight)."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.down = False
        self.look_s = 0.0
        self.looks = 0
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def head(self) -> int:
        self.looks += 1
        self.entered.set()
        if self.gate is not None:
            self.gate.wait()
        self.clock[0] += self.look_s
        if self.down:
            raise ConnectionError("the database did not answer")
        return 1

    def current_rows(self) -> tuple[int, list[Any]]:
        return 1, []

    def report_damage(self, error: Exception) -> None:  # pragma: no cover - never damaged
        raise AssertionError(error)


def _authorizer(store: _Store) -> StoredPolicyAuthorizer:
    authorizer = StoredPolicyAuthorizer(
        store,  # type: ignore[arg-type]
        packaged_model_text(),
        refresh_s=0.25,
        monotonic=lambda: store.clock[0],
    )
    assert authorizer.refresh() == ""
    return authorizer


def _decide(authorizer: StoredPolicyAuthorizer) -> str:
    decision = authorizer.decide(
        app_id="app:planner",
        tenant="default",
        action="read",
        category="diet",
        purpose="personalization",
    )
    assert not decision.allowed
    return decision.reason


def test_a_failed_look_is_remembered_from_when_it_answered_not_when_it_began() -> None:
    """Bug OM: a look during an outage waits ~22 s; remembered from its start, the next
    request (queued behind it, or just after it) found it 22 s old, past the refresh
    bound, and looked again: another 22 s. Remembered from its answer, the refresh bound
    holds from what was last seen; and a forced look (``health``, the privacy center's
    after a denial: 0176's MH) still looks now, so recovery is not slowed."""
    clock = [100.0]
    store = _Store(clock)
    authorizer = _authorizer(store)
    store.down, store.look_s = True, 22.0
    clock[0] += 1.0  # the next look is due
    assert "policy store unreadable" in _decide(authorizer)
    assert store.looks == 2
    clock[0] += 0.1  # just after the failed look answered
    assert "policy store unreadable" in _decide(authorizer)
    assert store.looks == 2, "the request looked again right after a failed look"
    store.down, store.look_s = False, 0.0  # the store is back
    assert authorizer.health() == ""  # looked now: not held back by the remembered failure
    assert store.looks == 3


def test_a_request_does_not_queue_behind_a_look_at_a_store_known_to_be_down() -> None:
    """Bug OM: the policy's lock serialised its looks, so with the store down every
    request of the process waited behind the one looking (22 s each). The store was
    known not to answer: a request answers from that (denied, fail closed) at once
    instead of waiting for the look in flight, which is the next one to find it back."""
    clock = [100.0]
    store = _Store(clock)
    authorizer = _authorizer(store)
    store.down = True
    clock[0] += 1.0
    _decide(authorizer)  # the outage is known
    clock[0] += 1.0  # the next look is due
    store.gate, store.entered = threading.Event(), threading.Event()
    safety = threading.Timer(30, store.gate.set)  # on main the test would wait forever
    safety.start()
    looking = threading.Thread(target=_decide, args=(authorizer,))
    looking.start()
    try:
        assert store.entered.wait(30)
        reason = _decide(authorizer)  # while the look is in flight
        in_flight = not store.gate.is_set()
    finally:
        store.gate.set()
        safety.cancel()
        looking.join()
    assert in_flight, "the request waited for the look in flight"
    assert "policy store unreadable" in reason
    assert store.looks == 3


def test_requests_waiting_for_a_look_take_its_answer_without_looking_again() -> None:
    """Bug OM, from a healthy store: a request that must wait for the look in flight
    (the policy was in force: its refresh bound holds) takes that look's answer, which
    began after it asked, instead of looking again once it gets the lock."""
    clock = [100.0]
    store = _Store(clock)
    authorizer = _authorizer(store)
    store.down, store.look_s = True, 22.0
    clock[0] += 1.0
    store.gate, store.entered = threading.Event(), threading.Event()
    first = threading.Thread(target=_decide, args=(authorizer,))
    first.start()
    assert store.entered.wait(30)
    waiting = threading.Thread(target=_decide, args=(authorizer,))
    waiting.start()
    store.gate.set()
    first.join()
    waiting.join()
    assert store.looks == 2
