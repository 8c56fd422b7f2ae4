"""A withdrawal with ``erase`` stopped between its withdrawal and its erasure (review of
0203 and 0205, bug RE; 0205's Left).

``withdraw_consent(erase=True)`` writes the withdrawal (``erase_requested``), then
erases what was collected under it (``erase_captures``, which waits for the views and
may be refused or fail there, or its process die). Nothing of the erasure was recorded
yet, so there is nothing for ``resume`` to finish; on main a retry that carried no
request token (the CLI's ``uprof consent withdraw --erase``, REST without an
``Idempotency-Key``, MCP ``forget``, the privacy center) found the consent "withdrawn
with erase already" and returned nothing: the consent withdrawn, the captures kept, and
no retry that erased them. The first process is real and killed with SIGKILL where its
erasure found the subject (after the withdrawal, before ``erasure.requested``)."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from domain.errors import ReadTimeoutError
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, build_kernel, consented_settings, say
from tests.kernel.test_simultaneous_erasure_receipts import Held, request_of
from tests.kernel.test_withdraw_erasure_once import keyed_withdrawal
from uprof.kernel import Uprof
from uprof.settings import Settings


def unkeyed_withdrawal(consent_id: str, kernel: Any) -> Any:
    """``call`` for ``Held``: the withdrawal with erase as the CLI and MCP run it."""
    return kernel.withdraw_consent("alice", consent_id, erase=True)


def collected(kernel: Uprof, consent_id: str) -> list[str]:
    """The captures the views still list under the consent's app and purposes."""
    grant = next(c for c in kernel.profile("alice").consents if c.consent_id == consent_id)
    return kernel.queries.captures_by(
        str(kernel.stream_of("alice")), app_id=APP, purposes=grant.purposes
    )


@pytest.fixture
def setup(backend: Backend) -> tuple[Settings, str]:
    settings = consented_settings(backend)
    kernel = build_kernel(settings, FakeClock())
    try:
        consent_id = kernel.profile("alice").consents[0].consent_id
        kernel.capture("alice", say("I want to learn to sail"))
        kernel.process()
        assert len(collected(kernel, consent_id)) == 1
    finally:
        kernel.close()
    return settings, consent_id


def _killed_after_withdrawing(settings: Settings, consent_id: str, call: Any) -> None:
    first = Held(settings, "after-lookup", call=functools.partial(call, consent_id))
    first.begin()  # withdrawn with erase requested; the erasure found the subject
    first.kill()
    kernel = build_kernel(settings, FakeClock())
    try:
        kernel.process()
        grant = next(c for c in kernel.profile("alice").consents if c.consent_id == consent_id)
        assert grant.withdrawn_at is not None and grant.erase_requested, grant
        assert len(collected(kernel, consent_id)) == 1  # nothing erased yet
    finally:
        kernel.close()


def test_a_withdrawal_killed_before_its_erasure_is_finished_by_a_retry_without_a_token(
    setup: tuple[Settings, str],
) -> None:
    settings, consent_id = setup
    _killed_after_withdrawing(settings, consent_id, unkeyed_withdrawal)
    kind, receipt = Held(settings, call=functools.partial(unkeyed_withdrawal, consent_id)).answer()
    assert kind == "ok" and receipt is not None, receipt
    kernel = build_kernel(settings, FakeClock())
    try:
        kernel.process()
        assert collected(kernel, consent_id) == []
        # Asked once more: nothing left, nothing written.
        assert kernel.withdraw_consent("alice", consent_id, erase=True) is None
        requested = [
            e.entry["request_id"]
            for e in kernel.audit_entries(action="erasure.requested")
            if e.entry.get("reason_code") == "consent-withdrawal"
        ]
    finally:
        kernel.close()
    assert requested == [request_of(receipt)], requested


def test_held_a_keyed_withdrawal_killed_before_its_erasure_is_finished_by_its_resend(
    setup: tuple[Settings, str],
) -> None:
    settings, consent_id = setup
    _killed_after_withdrawing(settings, consent_id, keyed_withdrawal)
    kind, receipt = Held(settings, call=functools.partial(keyed_withdrawal, consent_id)).answer()
    assert kind == "ok" and receipt is not None, receipt
    kernel = build_kernel(settings, FakeClock())
    try:
        kernel.process()
        assert collected(kernel, consent_id) == []
    finally:
        kernel.close()


def test_a_withdrawal_whose_erasure_timed_out_is_finished_by_asking_again(
    setup: tuple[Settings, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The erasure's own wait for the views ran out after the withdrawal was written
    ("nothing was erased, ask again"): asking again erases."""
    settings, consent_id = setup
    kernel = build_kernel(settings, FakeClock())
    try:
        service = kernel.erasure_service
        real = service._require_views_current

        def lagging(timeout_s: float) -> None:
            raise ReadTimeoutError("the views did not catch up; nothing was erased, ask again")

        monkeypatch.setattr(service, "_require_views_current", lagging)
        with pytest.raises(ReadTimeoutError):
            kernel.withdraw_consent("alice", consent_id, erase=True)
        monkeypatch.setattr(service, "_require_views_current", real)
        kernel.process()
        assert len(collected(kernel, consent_id)) == 1
        result = kernel.withdraw_consent("alice", consent_id, erase=True)
        assert result is not None and result.receipt is not None
        kernel.process()
        assert collected(kernel, consent_id) == []
    finally:
        kernel.close()
