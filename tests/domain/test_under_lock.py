"""``domain.under_lock.asked_within``: what a bounded check sees, raises and leaves behind
(0231-review-of-0227; bugs VX, VY of the review of 0226 and 0231)."""

from __future__ import annotations

import contextvars
import threading

import pytest

import domain.under_lock as under_lock
from domain.errors import CheckUnansweredError, PermissionDeniedError, StoreUnavailableError

_ACTING: contextvars.ContextVar[str | None] = contextvars.ContextVar("acting", default=None)

#: A generous bound for every wait on an observable condition.
WAIT_S = 30.0


def _checks_alive() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "check-under-lock")


def test_held_the_check_sees_the_callers_context_variables() -> None:
    """The acting principal and credential are context variables: the check, on a thread
    of its own, reads the caller's values."""
    seen: list[str | None] = []
    token = _ACTING.set("app:planner")
    try:
        under_lock.asked_within(lambda: seen.append(_ACTING.get()), WAIT_S)
    finally:
        _ACTING.reset(token)
    assert seen == ["app:planner"]


def test_held_a_check_that_raises_raises_its_own_error() -> None:
    """A refusal is the check's own error (a revoked key: 401 at the edge), not an outage."""

    def revoked() -> None:
        raise PermissionDeniedError("the key was revoked")

    with pytest.raises(PermissionDeniedError, match="the key was revoked"):
        under_lock.asked_within(revoked, WAIT_S)


def test_held_a_check_past_its_bound_is_an_outage_and_its_thread_ends_with_it() -> None:
    release = threading.Event()
    before = _checks_alive()
    with pytest.raises(StoreUnavailableError):
        under_lock.asked_within(lambda: release.wait(WAIT_S), 0.05)
    assert _checks_alive() == before + 1  # left running, its answer unused
    release.set()
    for thread in [t for t in threading.enumerate() if t.name == "check-under-lock"]:
        thread.join(WAIT_S)
    assert _checks_alive() == before


def test_vy_past_the_checks_left_running_the_next_is_refused_at_once() -> None:
    """Bug VY: with ``MAX_CHECKS_LEFT_RUNNING`` checks still waiting on a hung store, the
    next is refused without a thread; once they answer, checks run again."""
    release = threading.Event()
    bound = under_lock.MAX_CHECKS_LEFT_RUNNING
    try:
        for _ in range(bound):
            with pytest.raises(CheckUnansweredError):
                under_lock.asked_within(lambda: release.wait(WAIT_S), 0.01)
        alive = _checks_alive()
        asked: list[bool] = []
        with pytest.raises(CheckUnansweredError, match="still waiting"):
            under_lock.asked_within(lambda: asked.append(True), WAIT_S)
        assert asked == [] and _checks_alive() == alive
    finally:
        release.set()
    for thread in [t for t in threading.enumerate() if t.name == "check-under-lock"]:
        thread.join(WAIT_S)
    asked_again: list[bool] = []
    under_lock.asked_within(lambda: asked_again.append(True), WAIT_S)
    assert asked_again == [True]


def test_held_every_road_gives_its_slot_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Held (0236-review-of-0232): a check that raises after its bound, one that raises
    what is no Exception (``SystemExit``, as a ``sys.exit`` deep in a driver would), and
    one whose thread could not start each give their slot back: afterwards exactly
    ``MAX_CHECKS_LEFT_RUNNING`` checks can be left running again, and not one more."""
    release = threading.Event()

    def late_refusal() -> None:
        release.wait(WAIT_S)
        raise PermissionDeniedError("revoked, said late")

    def exits() -> None:
        raise SystemExit(3)

    with pytest.raises(CheckUnansweredError):
        under_lock.asked_within(late_refusal, 0.01)
    with pytest.raises(SystemExit):
        under_lock.asked_within(exits, WAIT_S)

    def cannot_start(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patched:
        patched.setattr(threading.Thread, "start", cannot_start)
        with pytest.raises(RuntimeError):
            under_lock.asked_within(lambda: None, WAIT_S)
    release.set()
    for thread in [t for t in threading.enumerate() if t.name == "check-under-lock"]:
        thread.join(WAIT_S)
    hold = threading.Event()
    try:
        for _ in range(under_lock.MAX_CHECKS_LEFT_RUNNING):
            with pytest.raises(CheckUnansweredError, match="did not answer"):
                under_lock.asked_within(lambda: hold.wait(WAIT_S), 0.01)
        with pytest.raises(CheckUnansweredError, match="still waiting"):
            under_lock.asked_within(lambda: None, WAIT_S)
    finally:
        hold.set()
    for thread in [t for t in threading.enumerate() if t.name == "check-under-lock"]:
        thread.join(WAIT_S)
