"""Capture, item and consent-withdrawal erasures confirm their purge before the receipt
(both backends).

Found by reading the code after decision 0051: these erasures signed a receipt citing
``projection_purged`` without checking that the projections had passed the tombstone.
Now an erasure whose purge did not finish within the wait bound answers
``erasure_incomplete``, and asking again with the same scope and target finishes it
with the receipt of that same request, from any process.
"""

from __future__ import annotations

import pytest

from audit.receipts import verify_receipt
from domain.errors import (
    ErasureIncompleteError,
    InvalidInputError,
    ItemNotFoundError,
    ReadTimeoutError,
)
from tests.conftest import Backend
from tests.kernel.conftest import consent, say
from tests.kernel.other_process import receipt_from_another_process
from uprof.kernel import Uprof


def projections_stall_after_first_wait(kernel: Uprof, monkeypatch: pytest.MonkeyPatch) -> None:
    """The erasure's first wait (for current views, before anything is written) is
    served; the projections then stall there and pass nothing written after it."""
    service = kernel.erasure_service
    real = service._catch_up
    reached: list[int] = []

    def catch_up(position: int, timeout: float) -> bool:
        if not reached:
            reached.append(position)
            return real(position, timeout)
        return position <= reached[0]

    monkeypatch.setattr(service, "_catch_up", catch_up)


def unfinished_request(kernel: Uprof, scope: str, target: list[str]) -> str | None:
    ledger = kernel.keystore.ledger
    assert ledger is not None
    record = ledger.unfinished(kernel.subjects.tenant, "alice", scope=scope, target=target)
    return None if record is None else record.request_id


def capture_ids(kernel: Uprof) -> set[str]:
    return {c.capture_id for c in kernel.queries.all_captures(str(kernel.stream_of("alice")))}


def test_a_capture_erasure_is_receipted_only_once_purged(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    consent(kernel)
    ack = kernel.capture("alice", say("I want to learn to sail", ref="sail"))
    kernel.capture("alice", say("I live in Porto", ref="porto"))
    with monkeypatch.context() as behind:
        projections_stall_after_first_wait(kernel, behind)
        with pytest.raises(ErasureIncompleteError, match="Ask again"):
            kernel.erase_capture("alice", ack.capture_id)
        # Still behind: asking again says so again.
        with pytest.raises(ErasureIncompleteError):
            kernel.erase_capture("alice", ack.capture_id)
    request_id = unfinished_request(kernel, "capture", [ack.capture_id])
    assert request_id, "the incomplete erasure left no record to finish it by"

    result = kernel.erase_capture("alice", ack.capture_id)

    body = result.receipt["body"]
    assert body["request"]["request_id"] == request_id
    assert body["request"]["scope"] == "capture"
    verify_receipt(result.receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    view = kernel.profile("alice")
    assert view.intents == ()
    assert {m.source_refs for m in view.memories} == {("porto",)}
    assert ack.capture_id not in capture_ids(kernel)
    assert unfinished_request(kernel, "capture", [ack.capture_id]) is None
    # Finished once: the capture is gone, so a third request names nothing.
    with pytest.raises(InvalidInputError, match="no captured event") as refused:
        kernel.erase_capture("alice", ack.capture_id)
    assert refused.value.field == "capture_id"


def test_an_item_erasure_is_receipted_only_once_purged(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    consent(kernel)
    kernel.capture("alice", say("I want to learn to sail"))
    (intent,) = kernel.profile("alice").intents
    with monkeypatch.context() as behind:
        projections_stall_after_first_wait(kernel, behind)
        with pytest.raises(ErasureIncompleteError, match="the item's erasure is recorded"):
            kernel.erase_item("alice", intent.item_id)
    request_id = unfinished_request(kernel, "item", [intent.item_id])
    assert request_id

    result = kernel.erase_item("alice", intent.item_id)

    assert result.receipt["body"]["request"]["request_id"] == request_id
    verify_receipt(result.receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    assert kernel.profile("alice").intents == ()
    with pytest.raises(ItemNotFoundError):
        kernel.erase_item("alice", intent.item_id)


def test_an_item_erasure_with_evidence_is_finished_by_the_item_id(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    consent(kernel)
    ack = kernel.capture("alice", say("I want to learn to sail"))
    (intent,) = kernel.profile("alice").intents
    with monkeypatch.context() as behind:
        projections_stall_after_first_wait(kernel, behind)
        with pytest.raises(ErasureIncompleteError):
            kernel.erase_item("alice", intent.item_id, with_evidence=True)
    request_id = unfinished_request(kernel, "item-with-evidence", [intent.item_id])
    assert request_id

    # Once purged, the item and its capture are gone from the views: only the ledger
    # still knows which erasure this was.
    result = kernel.erase_item("alice", intent.item_id, with_evidence=True)

    assert result.receipt["body"]["request"]["request_id"] == request_id
    assert result.receipt["body"]["request"]["scope"] == "item-with-evidence"
    verify_receipt(result.receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    view = kernel.profile("alice")
    assert view.intents == () and view.memories == ()
    assert ack.capture_id not in capture_ids(kernel)


def test_a_withdrawal_with_erase_is_finished_by_asking_again(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    consent_id = consent(kernel)
    kernel.capture("alice", say("I want to learn to sail"))
    with monkeypatch.context() as behind:
        projections_stall_after_first_wait(kernel, behind)
        with pytest.raises(ErasureIncompleteError):
            kernel.withdraw_consent("alice", consent_id, erase=True, request_token="w-1")
    request_id = unfinished_request(kernel, "consent-withdrawal", [consent_id])
    assert request_id

    result = kernel.withdraw_consent("alice", consent_id, erase=True, request_token="w-1")

    assert result is not None
    assert result.receipt["body"]["request"]["request_id"] == request_id
    verify_receipt(result.receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    assert kernel.profile("alice").memories == ()
    assert capture_ids(kernel) == set()


def test_an_item_extracted_after_the_erasure_began_is_erased_before_the_receipt(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The items citing a capture are read from the views when the erasure begins; one
    projected later (extraction raced the request) is found by the purge check and
    erased, instead of outliving its evidence."""
    consent(kernel)
    ack = kernel.capture("alice", say("I want to learn to sail"))
    kernel.process()
    # As if the views had not yet listed the capture's items when the erasure began.
    monkeypatch.setattr(kernel.erasure_service, "_items_citing", lambda stream, capture: [])

    result = kernel.erase_capture("alice", ack.capture_id)

    verify_receipt(result.receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    view = kernel.profile("alice")
    assert view.memories == () and view.intents == ()
    assert result.counts["items_erased"] >= 2  # the memory and the intent


def test_stale_views_refuse_before_anything_is_erased(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    consent(kernel)
    ack = kernel.capture("alice", say("I want to learn to sail"))
    (intent,) = kernel.profile("alice").intents
    ledger = kernel.keystore.ledger
    assert ledger is not None
    records = len(ledger.state().captures.get(str(kernel.stream_of("alice")), ()))
    with monkeypatch.context() as behind:
        behind.setattr(kernel.erasure_service, "_catch_up", lambda position, timeout: False)
        with pytest.raises(ReadTimeoutError, match="nothing was erased"):
            kernel.erase_capture("alice", ack.capture_id)
        with pytest.raises(ReadTimeoutError, match="nothing was erased"):
            kernel.erase_item("alice", intent.item_id)
    assert len(ledger.state().captures.get(str(kernel.stream_of("alice")), ())) == records
    assert ack.capture_id in capture_ids(kernel)
    assert [i.item_id for i in kernel.profile("alice").intents] == [intent.item_id]


def test_another_process_finishes_an_incomplete_capture_erasure(
    backend: Backend, kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    consent(kernel)
    ack = kernel.capture("alice", say("I want to learn to sail"))
    with monkeypatch.context() as behind:
        projections_stall_after_first_wait(kernel, behind)
        with pytest.raises(ErasureIncompleteError):
            kernel.erase_capture("alice", ack.capture_id)
    request_id = unfinished_request(kernel, "capture", [ack.capture_id])
    receipt = receipt_from_another_process(backend, f"erase_capture('alice', {ack.capture_id!r})")
    assert receipt["body"]["request"]["request_id"] == request_id
    verify_receipt(receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    assert unfinished_request(kernel, "capture", [ack.capture_id]) is None
    assert kernel.profile("alice").intents == ()
