"""The SDK's public surface is locked (STYLE P13): changing it must change this test."""

from __future__ import annotations

import inspect
from pathlib import Path

import uprof.sdk

PUBLIC = [
    "APIError",
    "AsyncClient",
    "AttributeOut",
    "AttributeProposalIn",
    "AuditEntryOut",
    "AuditEntryPage",
    "AuditExport",
    "AuditKey",
    "AuditVerification",
    "AuthenticationError",
    "CaptureAck",
    "CapturedEvent",
    "Client",
    "ConflictError",
    "Consent",
    "ConsentList",
    "ConsentWithdrawn",
    "ErasureReceipt",
    "Evidence",
    "ExperienceProposalIn",
    "FieldProblem",
    "GoneError",
    "IntentOut",
    "IntentProposalIn",
    "IntentUpdateIn",
    "InteractionBody",
    "InvalidRequestError",
    "LeftOutItem",
    "MemoryOut",
    "MemoryPage",
    "MemoryProposalIn",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "Profile",
    "ProfileSlice",
    "ReceiptOut",
    "ReceiptPage",
    "ReceiptRotationProof",
    "ServerError",
    "ServiceUnavailableError",
    "SliceItem",
    "SubjectOut",
    "SubjectPage",
    "TransportError",
    "UprofClientError",
    "WhoAmI",
]

CLIENT_METHODS = [
    "audit_entries",
    "audit_export",
    "audit_export_to",
    "audit_key",
    "audit_proof",
    "audit_receipts",
    "audit_rotation_proof",
    "audit_verify",
    "capture",
    "capture_many",
    "consents",
    "erase_capture",
    "erase_item",
    "erase_subject",
    "evidence",
    "export_subject",
    "export_subject_to",
    "grant_consent",
    "iter_audit_entries",
    "iter_audit_receipts",
    "iter_consents",
    "iter_memories",
    "iter_subjects",
    "list_consents",
    "list_memories",
    "list_subjects",
    "profile",
    "register_identifier",
    "register_session",
    "slice",
    "submit_proposals",
    "whoami",
    "withdraw_consent",
]


def test_public_names_are_exactly_the_locked_list() -> None:
    assert uprof.sdk.__all__ == PUBLIC
    assert sorted(uprof.sdk.__all__) == uprof.sdk.__all__
    public_attributes = {n for n in vars(uprof.sdk) if not n.startswith("_")}
    # Only the listed names and the private modules they come from are visible.
    assert public_attributes - set(PUBLIC) == set()


def test_sync_and_async_clients_offer_the_same_methods() -> None:
    def methods(cls: type) -> list[str]:
        return sorted(n for n in vars(cls) if not n.startswith("_") and callable(getattr(cls, n)))

    sync = [m for m in methods(uprof.sdk.Client) if m not in ("close", "embedded")]
    assert sync == CLIENT_METHODS
    assert [m for m in methods(uprof.sdk.AsyncClient) if m != "aclose"] == CLIENT_METHODS


def test_the_package_ships_py_typed() -> None:
    assert (Path(uprof.sdk.__file__).parent / "py.typed").exists()


def test_a_consent_grant_names_its_collection_record_in_the_signature() -> None:
    # The server refuses a grant without `collected_by` (422); the SDK used to default it to
    # None, so a user's type checker and editor presented a required field as optional
    # (0226-a-new-users-walk, Left). Both clients now make the caller name it.
    for client in (uprof.sdk.Client, uprof.sdk.AsyncClient):
        parameter = inspect.signature(client.grant_consent).parameters["collected_by"]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
        assert parameter.default is inspect.Parameter.empty
        assert parameter.annotation in ("str", str)
