"""The audit trail for compliance teams: export with proofs, consistency proofs, verify,
and the key to pin.

Export, proofs and verify need the ``operator`` role (the trail names every app and every
subject's pseudonym); the public key and latest checkpoint are for any app, since a
third party verifies exports and receipts offline with exactly these.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials

from uprof.api.deps import Scope, bearer_scheme, while_key_live
from uprof.api.routes.docs import api_router, errors
from uprof.schemas.api import (
    AuditEntriesIn,
    AuditEntryPage,
    AuditExportIn,
    AuditKey,
    AuditProof,
    AuditProofIn,
    AuditVerification,
    AuditVerifyIn,
    ReceiptListIn,
    ReceiptPage,
    ReceiptRotationProof,
    ReceiptRotationProofIn,
)

router = api_router(prefix="/v1/audit", tags=["audit"])


@router.post(
    "/export",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "The export file, streamed as it is produced: JSONL "
            "(application/x-ndjson) or CSV (text/csv), per docs/audit-format.md.",
            "content": {"application/x-ndjson": {}, "text/csv": {}},
        },
        **errors(403, 503),
    },
)
def export_trail(
    body: AuditExportIn,
    scope: Scope,
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> StreamingResponse:
    """Export the trail (optionally filtered) with inclusion proofs and a signed checkpoint.

    The answer is the file itself, streamed while it is produced (the trail can be large):
    save it and check it offline with ``uprof audit verify FILE --public-key PEM`` and the
    key from ``/v1/audit/key``. Refusals (403, 422) come before the first byte. The export
    is itself audited (``audit.exported``, with the number of entries sent). A key revoked
    or a right taken away while the file is sent ends it (the connection is cut).
    """
    stream = scope.audit_export_stream(body)
    assert credentials is not None  # Scope authenticated this request's key
    return StreamingResponse(
        while_key_live(stream.records, request.app.state.api_keys, credentials.credentials),
        media_type=stream.media_type,
        headers={"Content-Disposition": f'attachment; filename="{stream.filename}"'},
    )


@router.post(
    "/proof",
    response_model=AuditProof,
    response_class=Response,
    responses={
        200: {
            "description": "The proof document (uprof.audit-proof/v1), as the RFC 8785 "
            "canonical JSON file the offline verifier reads: save the body unchanged.",
            "content": {"application/json": {}},
        },
        **errors(403, 503),
    },
)
def prove(body: AuditProofIn, scope: Scope) -> Response:
    """A fresh signed checkpoint and the proof that the log only grew since the tree of
    ``old_size`` entries (the size of a checkpoint you hold), plus entry ``leaf_index``
    with its inclusion proof if asked (``operator`` role; the policy's ``audit``).

    Check it offline with ``uprof audit verify-proof FILE --trusted-checkpoint OLD
    --public-key PEM``. Every proof is against the checkpoint in the answer, whatever is
    appended meanwhile. Audited (``audit.proof_served``).
    """
    return Response(content=scope.audit_proof(body), media_type="application/json")


@router.post(
    "/rotation-proof", response_model=ReceiptRotationProof, responses=errors(403, 422, 503)
)
def rotation_proof(body: ReceiptRotationProofIn, scope: Scope) -> ReceiptRotationProof:
    """The rotation proof of an erasure receipt issued before an audit key rotation: the
    log's consistency proof from the receipt's checkpoint to the point where its key was
    rotated out, which an offline check with the key history needs (``uprof audit
    verify-receipt RECEIPT --key-history keys.json --rotation-proof FILE``, FILE holding
    ``rotation_proof``). ``operator`` role, the policy's ``audit``; this tenant's receipts
    only (another tenant's or a forged one: 422). Audited (``audit.proof_served``).
    With ``checkpoint`` instead (an export header's signed note, or a proof document),
    the same proof for an export or proof document signed before the rotation (``uprof
    audit verify`` / ``verify-proof --rotation-proof FILE``); a note of another log or
    of a fork of this one: 422.
    """
    return scope.receipt_rotation_proof(body)


@router.post("/entries", response_model=AuditEntryPage, responses=errors(403, 503))
def list_entries(body: AuditEntriesIn, scope: Scope) -> AuditEntryPage:
    """Audit entries in leaf order (optionally filtered), a page at a time (``operator`` role).

    For a file with inclusion proofs to verify offline, use ``/v1/audit/export``.
    """
    return scope.audit_entries(body)


@router.post("/receipts", response_model=ReceiptPage, responses=errors(403, 503))
def list_receipts(body: ReceiptListIn, scope: Scope) -> ReceiptPage:
    """The erasure receipts the log recorded, oldest first, a page at a time (``operator``)."""
    return scope.audit_receipts(body)


@router.post("/verify", response_model=AuditVerification, responses=errors(403))
def verify(body: AuditVerifyIn, scope: Scope) -> AuditVerification:
    """Verify an export or an erasure receipt against this log; say where it fails."""
    return scope.audit_verify(body)


@router.get("/key", response_model=AuditKey, responses=errors())
def key(scope: Scope) -> AuditKey:
    """The log's origin, public key (PEM) and latest signed checkpoint."""
    return scope.audit_key()
