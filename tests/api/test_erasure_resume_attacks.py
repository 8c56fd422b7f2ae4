"""Finishing an erasure that answered ``erasure_incomplete``, attacked over REST (both
backends): who may finish it, what a refused caller learns, and a withdrawal retried
without its ``Idempotency-Key``.
"""

from __future__ import annotations

import httpx
import pytest

from audit.receipts import RECEIPT_ACTION, verify_receipt
from tests.api.conftest import Apps, bearer, grant, interaction
from tests.kernel.test_erasure_resume_scopes import projections_stall_after_first_wait
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof


def _unfinished(kernel: Uprof, scope: str, target: list[str]) -> str | None:
    ledger = kernel.keystore.ledger
    assert ledger is not None
    record = ledger.unfinished(kernel.subjects.tenant, "alice", scope=scope, target=target)
    return None if record is None else record.request_id


def _receipts(kernel: Uprof) -> int:
    return sum(1 for _ in kernel.audit_entries(action=RECEIPT_ACTION))


def _capture(http: httpx.Client, apps: Apps, kernel: Uprof, text: str) -> str:
    response = http.post(
        "/v1/captures", headers=bearer(apps.planner), json={"subject": "alice", **interaction(text)}
    )
    assert response.status_code == 201, response.text
    assert kernel.wait_until_caught_up(30)
    return str(response.json()["capture_id"])


def test_only_a_caller_with_the_erase_right_finishes_an_incomplete_erasure(
    http: httpx.Client,
    apps: Apps,
    keys: ApiKeyStore,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    grant(http, apps.planner)
    capture_id = _capture(http, apps, kernel, "I want to learn to sail")
    _capture(http, apps, kernel, "I live in Porto")
    with monkeypatch.context() as behind:
        projections_stall_after_first_wait(kernel, behind)
        first = http.post(
            "/v1/governance/erasures/capture",
            headers=bearer(apps.privacy),
            json={"subject": "alice", "capture_id": capture_id},
        )
    assert first.status_code == 503, first.text
    assert first.json()["error"]["code"] == "erasure_incomplete"
    request_id = _unfinished(kernel, "capture", [capture_id])
    assert request_id
    receipts = _receipts(kernel)
    rogue = keys.create("app:rogue").token

    # Apps without the erase right, asking to finish it, and asking about a subject
    # and a capture that do not exist: the same answer, naming neither.
    for key in (apps.planner, apps.calendar, rogue):
        refused = []
        for subject, capture in (("alice", capture_id), ("nobody", "c-none")):
            response = http.post(
                "/v1/governance/erasures/capture",
                headers=bearer(key),
                json={"subject": subject, "capture_id": capture},
            )
            assert response.status_code == 403, response.text
            refused.append(response.json())
        assert refused[0] == refused[1], refused
        assert capture_id not in str(refused) and request_id not in str(refused)
    # None of them finished it, nor got or caused a receipt.
    assert _unfinished(kernel, "capture", [capture_id]) == request_id
    assert _receipts(kernel) == receipts

    finished = http.post(
        "/v1/governance/erasures/capture",
        headers=bearer(apps.privacy),
        json={"subject": "alice", "capture_id": capture_id},
    )
    assert finished.status_code == 200, finished.text
    receipt = finished.json()["receipt"]
    assert receipt["body"]["request"]["request_id"] == request_id
    verify_receipt(receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    assert _unfinished(kernel, "capture", [capture_id]) is None


def test_a_withdrawal_erasure_is_finished_by_a_retry_without_its_idempotency_key(
    http: httpx.Client, apps: Apps, kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented way to finish (503: "send the same erasure again") is the same
    request; a client that sent no ``Idempotency-Key`` has no other. Before the fix the
    retry answered 422: the consent was withdrawn already."""
    consent_id = grant(http, apps.planner)
    _capture(http, apps, kernel, "I want to learn to sail")
    body = {"subject": "alice", "consent_id": consent_id, "erase": True}
    with monkeypatch.context() as behind:
        projections_stall_after_first_wait(kernel, behind)
        first = http.post("/v1/consents/withdraw", headers=bearer(apps.planner), json=body)
    assert first.status_code == 503, first.text
    assert first.json()["error"]["code"] == "erasure_incomplete"
    request_id = _unfinished(kernel, "consent-withdrawal", [consent_id])
    assert request_id

    again = http.post("/v1/consents/withdraw", headers=bearer(apps.planner), json=body)

    assert again.status_code == 200, again.text
    answer = again.json()
    assert answer["consent"]["withdrawn_at"]
    receipt = answer["erasure"]["receipt"]
    assert receipt["body"]["request"]["request_id"] == request_id
    verify_receipt(receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    assert _unfinished(kernel, "consent-withdrawal", [consent_id]) is None
    # Another app cannot finish (or learn of) it by the consent id.
    other = http.post("/v1/consents/withdraw", headers=bearer(apps.calendar), json=body)
    assert other.status_code == 404, other.text
