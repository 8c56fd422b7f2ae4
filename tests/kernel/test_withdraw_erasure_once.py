"""Bug JG: a keyed ``withdraw_consent(erase=True)`` resent while the first request is
still erasing (two real processes, the first held inside its erasure). On main the
resend ran a second erasure request (held after its lookup or after
``erasure.requested``), or answered "nothing collected" for both callers (held after its
``CaptureErased``); now it waits for the first, and past the wait is refused
``RequestInProgressError`` (409 ``request_in_progress``), writing nothing."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, build_kernel, consented_settings, say
from tests.kernel.test_simultaneous_erasure_receipts import Held, request_of
from uprof.settings import Settings

KEY = "withdraw-erase-1"
IN_PROGRESS_WAIT_S = 1.0  # request_in_progress_wait_s of the held test


def keyed_withdrawal(consent_id: str, kernel: Any) -> Any:
    """``call`` for ``Held``: the keyed REST/SDK withdrawal with erase, as the API runs it."""

    class Answer:
        receipt: Any = None

    def execute(token: str) -> tuple[dict[str, Any], int]:
        result = kernel.withdraw_consent("alice", consent_id, erase=True, request_token=token)
        return {"receipt": result.receipt if result is not None else None}, 200

    body = {"subject": "alice", "consent_id": consent_id, "erase": True}
    outcome = kernel.idempotent(APP, KEY, "consent.withdraw", body, execute)
    answer = Answer()
    answer.receipt = outcome.response["receipt"]
    return answer


def _requested(kernel: Any) -> list[str]:
    return [
        e.entry["request_id"]
        for e in kernel.audit_entries(action="erasure.requested")
        if e.entry.get("reason_code") == "consent-withdrawal"
    ]


@pytest.fixture
def setup(backend: Backend) -> tuple[Settings, str]:
    settings = consented_settings(backend)
    kernel = build_kernel(settings, FakeClock())
    try:
        consent_id = kernel.profile("alice").consents[0].consent_id
        kernel.capture("alice", say("I want to learn to sail"))
        kernel.process()
    finally:
        kernel.close()
    return settings, consent_id


@pytest.mark.parametrize(
    "hold", ["after-lookup", "after-requested", "before-capture-preview", "before-capture-destroy"]
)
def test_a_keyed_withdrawal_resent_while_the_first_erases_runs_one_erasure(
    setup: tuple[Settings, str], hold: str
) -> None:
    settings, consent_id = setup
    # The first is held until the resend has answered, so the resend's wait for it can
    # only end refused: 1 s of it shows that as well as the default 10 s did.
    settings = settings.model_copy(update={"request_in_progress_wait_s": IN_PROGRESS_WAIT_S})
    call = functools.partial(keyed_withdrawal, consent_id)
    first = Held(settings, hold, call=call)
    resend = Held(settings, call=call)
    first.begin()  # the first request is inside its erasure, held
    kind_b, answer_b = resend.answer()  # the resend, from another process
    kind_a, answer_a = first.answer()
    kernel = build_kernel(settings, FakeClock())
    try:
        later = keyed_withdrawal(consent_id, kernel).receipt  # sent again once it answered
        requested = _requested(kernel)
    finally:
        kernel.close()
    assert later == answer_a, (later, answer_a)
    seen = (requested, kind_a, answer_a, kind_b, answer_b)
    assert kind_a == "ok" and answer_a is not None, seen
    assert len(requested) == 1, seen
    if kind_b == "ok":
        # The resend waited and answers with the first's receipt, never "nothing collected".
        assert answer_b == answer_a, seen
        assert request_of(answer_b) == requested[0], seen
    else:
        assert "RequestInProgressError" in answer_b, seen


def test_a_keyed_withdrawal_whose_first_was_killed_mid_erasure_is_not_blocked(
    setup: tuple[Settings, str],
) -> None:
    """The first request killed (SIGKILL) inside its erasure, past its ledger record:
    its lock died with it, so the resend runs at once and finishes that erasure with
    its receipt (the existing resume), one erasure request in all."""
    settings, consent_id = setup
    call = functools.partial(keyed_withdrawal, consent_id)
    first = Held(settings, "before-capture-destroy", call=call)
    first.begin()
    first.kill()
    kind, answer = Held(settings, call=call).answer()
    assert kind == "ok" and answer is not None, answer
    kernel = build_kernel(settings, FakeClock())
    try:
        requested = _requested(kernel)
    finally:
        kernel.close()
    assert requested == [request_of(answer)], (requested, answer)
