"""Governance: erasure with signed receipts and subject export, gated by the Casbin policy.

The kernel's erasure and export methods name no app and check no policy, so these
routes (through ``AppScope``) ask the policy first: ``erase`` for purpose
``erasure``, ``export`` for purpose ``access-request``, over every category. The
seed policy grants both to ``role:dpo`` only (``app:privacy-console``); any other
app gets 403.
"""

from __future__ import annotations

from uprof.api.deps import Scope
from uprof.api.routes.docs import api_router, errors
from uprof.schemas.api import (
    CaptureErasureIn,
    ErasureReceipt,
    ItemErasureIn,
    SubjectErasureIn,
    SubjectExport,
    SubjectExportIn,
)

router = api_router(prefix="/v1/governance", tags=["governance"])


@router.post(
    "/erasures/subject", response_model=ErasureReceipt, responses=errors(403, 404, 410, 503)
)
def erase_subject(body: SubjectErasureIn, scope: Scope) -> ErasureReceipt:
    """Erase a subject entirely and return the signed erasure receipt."""
    return scope.erase_subject(body)


@router.post("/erasures/item", response_model=ErasureReceipt, responses=errors(403, 404, 410, 503))
def erase_item(body: ItemErasureIn, scope: Scope) -> ErasureReceipt:
    """Erase one profile item (with ``with_evidence``, also the captures behind it)."""
    return scope.erase_item(body)


@router.post(
    "/erasures/capture", response_model=ErasureReceipt, responses=errors(403, 404, 410, 503)
)
def erase_capture(body: CaptureErasureIn, scope: Scope) -> ErasureReceipt:
    """Erase one captured event and everything derived only from it."""
    return scope.erase_capture(body)


@router.post("/exports", response_model=SubjectExport, responses=errors(403, 404, 410, 503))
def export_subject(body: SubjectExportIn, scope: Scope) -> SubjectExport:
    """Export everything held about a subject, with evidence (GDPR Art. 15/20)."""
    return scope.export_subject(body)
