"""Attacks on finishing an erasure that answered ``erasure_incomplete`` (decisions 0051,
0052): asked again in ways the first caller did not, by a second process at the same
moment, after the name was re-created, after a restore. Both backends.
"""

from __future__ import annotations

import pytest

from audit.receipts import verify_receipt
from domain.errors import ErasureIncompleteError, InvalidInputError, SubjectErasedError
from tests.kernel.conftest import consent, say
from tests.kernel.test_erasure import fill_with_canaries
from tests.kernel.test_erasure_resume import projections_stay_behind, rows_left
from tests.kernel.test_erasure_resume import unfinished_request as unfinished_subject_request
from tests.kernel.test_erasure_resume_scopes import (
    capture_ids,
    projections_stall_after_first_wait,
    unfinished_request,
)
from uprof.kernel import Uprof


@pytest.mark.parametrize("retry_token", [None, "w-2"], ids=["no-token", "other-token"])
def test_a_withdrawal_erasure_is_finished_without_the_first_request_token(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch, retry_token: str | None
) -> None:
    """The first request carried a token (REST: an ``Idempotency-Key``); the retry
    carries none, or another one. The consent is already withdrawn, so withdrawing it
    again is refused; finishing its erasure must not be."""
    consent_id = consent(kernel)
    kernel.capture("alice", say("I want to learn to sail"))
    with monkeypatch.context() as behind:
        projections_stall_after_first_wait(kernel, behind)
        with pytest.raises(ErasureIncompleteError):
            kernel.withdraw_consent("alice", consent_id, erase=True, request_token="w-1")
    request_id = unfinished_request(kernel, "consent-withdrawal", [consent_id])
    assert request_id

    result = kernel.withdraw_consent("alice", consent_id, erase=True, request_token=retry_token)

    assert result is not None
    assert result.receipt["body"]["request"]["request_id"] == request_id
    verify_receipt(result.receipt, kernel.audit_log.public_key)
    assert kernel.profile("alice").memories == ()
    assert capture_ids(kernel) == set()
    assert unfinished_request(kernel, "consent-withdrawal", [consent_id]) is None


# ------------------------------------------------------------------- re-created names


def _ledger_kinds(kernel: Uprof) -> list[str]:
    ledger = kernel.keystore.ledger
    assert ledger is not None
    return [r.kind for r in ledger._store.erasure_records()]


def _erased_entirely(kernel: Uprof, stream: str) -> None:
    assert rows_left(kernel, stream) == 0
    with pytest.raises(SubjectErasedError):
        kernel.profile("alice")


def test_an_incomplete_erasure_of_a_recreated_name_does_not_answer_for_the_new_subject(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Incomplete, then the operator re-creates the name: erasing the new subject is a
    new erasure of the new stream, not the old request's receipt."""
    fill_with_canaries(kernel, "alice")
    with monkeypatch.context() as behind:
        projections_stay_behind(kernel, behind)
        with pytest.raises(ErasureIncompleteError):
            kernel.erase_subject("alice")
    old_request = unfinished_subject_request(kernel, "alice")
    kernel.recreate_subject("alice")
    consent(kernel)
    kernel.capture("alice", say("I want to learn to sail"))
    kernel.process()
    new_stream = str(kernel.stream_of("alice"))

    result = kernel.erase_subject("alice")

    body = result.receipt["body"]
    assert body["request"]["request_id"] != old_request
    assert body["actions"][0]["stream"] == new_stream
    _erased_entirely(kernel, new_stream)


def test_a_name_recreated_while_its_erasure_waits_is_erased_anew_when_asked(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator (another process) re-creates the name while the erasure waits for the
    purge; the wait then runs out, so the ``incomplete`` record lands after ``recreated``.
    Erasing the new subject must not be answered with the old request's receipt while
    the new subject's data stays."""
    fill_with_canaries(kernel, "alice")
    old_stream = str(kernel.stream_of("alice"))
    service = kernel.erasure_service
    real = service._catch_up
    waits: list[int] = []

    def catch_up(position: int, timeout: float) -> bool:
        waits.append(position)
        if len(waits) > 1:
            return real(position, timeout)
        kernel.recreate_subject("alice", requested_by="operator:other-process")
        consent(kernel)
        kernel.capture("alice", say("I want to learn to sail"))
        return False

    with monkeypatch.context() as racing:
        racing.setattr(service, "_catch_up", catch_up)
        with pytest.raises(ErasureIncompleteError):
            kernel.erase_subject("alice")
        assert _ledger_kinds(kernel)[-2:] == ["recreated", "incomplete"]
        kernel.process()
        new_stream = str(kernel.stream_of("alice"))
        assert new_stream != old_stream

        result = kernel.erase_subject("alice")

    assert result.receipt["body"]["actions"][0]["stream"] == new_stream
    _erased_entirely(kernel, new_stream)
    assert rows_left(kernel, old_stream) == 0
    # Both incarnations erased: the old one's draft does not answer for the name either.
    with pytest.raises(SubjectErasedError):
        kernel.erase_subject("alice")


def test_an_incomplete_capture_erasure_of_an_erased_incarnation_stays_its_own(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Old incarnation: a capture erasure left incomplete, then the whole subject erased.
    New incarnation: naming the old capture finds nothing; its own capture erasure is
    its own request."""
    consent(kernel)
    old = kernel.capture("alice", say("I want to learn to sail"))
    with monkeypatch.context() as behind:
        projections_stall_after_first_wait(kernel, behind)
        with pytest.raises(ErasureIncompleteError):
            kernel.erase_capture("alice", old.capture_id)
    old_request = unfinished_request(kernel, "capture", [old.capture_id])
    kernel.erase_subject("alice")
    kernel.recreate_subject("alice")
    consent(kernel)
    new = kernel.capture("alice", say("I want to learn to dance"))
    kernel.process()

    with pytest.raises(InvalidInputError, match="no captured event"):
        kernel.erase_capture("alice", old.capture_id)
    result = kernel.erase_capture("alice", new.capture_id)

    assert result.receipt["body"]["request"]["request_id"] != old_request
    assert result.receipt["body"]["actions"][0]["stream"] == str(kernel.stream_of("alice"))
    assert kernel.profile("alice").intents == ()
