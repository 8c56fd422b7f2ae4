"""Attacks on finishing an erasure that answered ``erasure_incomplete`` (decisions 0051,
0052): asked again in ways the first caller did not, by a second process at the same
moment, after the name was re-created, after a restore. Both backends.
"""

from __future__ import annotations

import pytest

from audit.receipts import verify_receipt
from domain.errors import ErasureIncompleteError
from tests.kernel.conftest import consent, say
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
