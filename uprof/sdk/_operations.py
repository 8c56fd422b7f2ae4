"""The operations of the API: one table shared by the HTTP and embedded backends.

Each request is built (and validated) here once, so both backends and both clients
send exactly the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from uprof.schemas import api as w
from uprof.schemas.api import field_problems
from uprof.sdk._errors import invalid_request

R = TypeVar("R", bound=BaseModel)


@dataclass(frozen=True)
class Operation(Generic[R]):
    """One API call: HTTP method and path, the ``AppScope`` method, the response model."""

    name: str
    method: str
    path: str
    response: type[R]
    #: A write the server answers once per ``Idempotency-Key``: the HTTP backends give it
    #: a key when the caller gave none, and retry it after a network failure.
    keyed: bool = False


CAPTURE = Operation("capture", "POST", "/v1/captures", w.CaptureAck, keyed=True)
CAPTURE_MANY = Operation(
    "capture_many", "POST", "/v1/captures/batch", w.CaptureBatchAck, keyed=True
)
SUBMIT_PROPOSALS = Operation(
    "submit_proposals", "POST", "/v1/proposals", w.ProposalsResult, keyed=True
)
SLICE = Operation("slice", "POST", "/v1/slices", w.ProfileSlice)
PROFILE = Operation("profile", "POST", "/v1/profile/read", w.Profile)
EVIDENCE = Operation("evidence", "POST", "/v1/evidence/read", w.Evidence)
GRANT_CONSENT = Operation("grant_consent", "POST", "/v1/consents", w.ConsentGranted, keyed=True)
CONSENTS = Operation("consents", "POST", "/v1/consents/list", w.ConsentList)
WITHDRAW_CONSENT = Operation(
    "withdraw_consent", "POST", "/v1/consents/withdraw", w.ConsentWithdrawn, keyed=True
)
REGISTER_SESSION = Operation("register_session", "POST", "/v1/sessions", w.Registered)
REGISTER_IDENTIFIER = Operation("register_identifier", "POST", "/v1/identifiers", w.Registered)
WHOAMI = Operation("whoami", "GET", "/v1/whoami", w.WhoAmI)
ERASE_SUBJECT = Operation(
    "erase_subject", "POST", "/v1/governance/erasures/subject", w.ErasureReceipt
)
ERASE_ITEM = Operation("erase_item", "POST", "/v1/governance/erasures/item", w.ErasureReceipt)
ERASE_CAPTURE = Operation(
    "erase_capture", "POST", "/v1/governance/erasures/capture", w.ErasureReceipt
)
EXPORT_SUBJECT = Operation("export_subject", "POST", "/v1/governance/exports", w.SubjectExport)
AUDIT_EXPORT = Operation("audit_export", "POST", "/v1/audit/export", w.AuditExport)
AUDIT_VERIFY = Operation("audit_verify", "POST", "/v1/audit/verify", w.AuditVerification)
AUDIT_KEY = Operation("audit_key", "GET", "/v1/audit/key", w.AuditKey)
#: Answers the proof document's file bytes (``Client.audit_proof``), not a parsed model.
AUDIT_PROOF = Operation("audit_proof", "POST", "/v1/audit/proof", w.AuditProof)
#: Named like the scope's method (the embedded backend calls it by this name).
RECEIPT_ROTATION_PROOF = Operation(
    "receipt_rotation_proof", "POST", "/v1/audit/rotation-proof", w.ReceiptRotationProof
)
AUDIT_ENTRIES = Operation("audit_entries", "POST", "/v1/audit/entries", w.AuditEntryPage)
AUDIT_RECEIPTS = Operation("audit_receipts", "POST", "/v1/audit/receipts", w.ReceiptPage)
LIST_MEMORIES = Operation("list_memories", "POST", "/v1/memories/list", w.MemoryPage)
LIST_SUBJECTS = Operation("list_subjects", "POST", "/v1/subjects/list", w.SubjectPage)


@dataclass(frozen=True)
class Call(Generic[R]):
    """An operation with its validated request body (None for GETs)."""

    operation: Operation[R]
    body: BaseModel | None
    #: Sent as the ``Idempotency-Key`` header (writes only): a retry is answered once.
    idempotency_key: str | None = None


def build(model: type[BaseModel], **fields: Any) -> BaseModel:
    """Validate a request client-side; refuse it with the same 422 shape the server uses."""
    try:
        return model.model_validate(fields)
    except ValidationError as error:
        raise invalid_request(field_problems([dict(e) for e in error.errors()])) from None


def now() -> datetime:
    return datetime.now(tz=UTC)


def interaction(
    *,
    agent_id: str,
    user_input: str = "",
    agent_response: str = "",
    occurred_at: datetime | None = None,
    session_id: str = "",
    actor: str = "",
    source_ref: str = "",
    purpose: str = "personalization",
    sharing: str = "private",
    agent_type: str = "",
    context: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The fields of one interaction, with ``occurred_at`` defaulting to now."""
    return {
        "agent_id": agent_id,
        "user_input": user_input,
        "agent_response": agent_response,
        "occurred_at": occurred_at or now(),
        "session_id": session_id,
        "actor": actor,
        "source_ref": source_ref,
        "purpose": purpose,
        "sharing": sharing,
        "agent_type": agent_type,
        "context": dict(context or {}),
        "occurred_at_defaulted": occurred_at is None,
    }


def interactions_of(items: Sequence[w.InteractionBody | Mapping[str, Any]]) -> list[Any]:
    return [i.model_dump() if isinstance(i, BaseModel) else dict(i) for i in items]


def proposals_of(items: Sequence[BaseModel | Mapping[str, Any]]) -> list[Any]:
    return [p.model_dump() if isinstance(p, BaseModel) else dict(p) for p in items]
