"""The audit trail for compliance teams: export with proofs, verify, and the key to pin.

Export and verify need the ``operator`` role (the trail names every app and every
subject's pseudonym); the public key and latest checkpoint are for any app, since a
third party verifies exports and receipts offline with exactly these.
"""

from __future__ import annotations

from fastapi import APIRouter

from uprof.api.deps import Scope
from uprof.api.routes.docs import errors
from uprof.schemas.api import AuditExport, AuditExportIn, AuditKey, AuditVerification, AuditVerifyIn

router = APIRouter(prefix="/v1/audit", tags=["audit"])


@router.post("/export", response_model=AuditExport, responses=errors(403, 503))
def export_trail(body: AuditExportIn, scope: Scope) -> AuditExport:
    """Export the trail (optionally filtered) with inclusion proofs and a signed checkpoint.

    Save ``content`` to a file and check it offline: ``uprof audit verify FILE --public-key
    PEM`` with the key from ``/v1/audit/key``. The export is itself audited.
    """
    return scope.audit_export(body)


@router.post("/verify", response_model=AuditVerification, responses=errors(403))
def verify(body: AuditVerifyIn, scope: Scope) -> AuditVerification:
    """Verify an export or an erasure receipt against this log; say where it fails."""
    return scope.audit_verify(body)


@router.get("/key", response_model=AuditKey, responses=errors())
def key(scope: Scope) -> AuditKey:
    """The log's origin, public key (PEM) and latest signed checkpoint."""
    return scope.audit_key()
