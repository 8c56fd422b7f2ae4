"""Consents the calling app holds from subjects: grant, list, withdraw."""

from __future__ import annotations

from fastapi import Response

from uprof.api.deps import IdempotencyKey, Prefer, Scope, client_waits, mark_replay
from uprof.api.routes.docs import api_router, errors
from uprof.schemas.api import (
    ConsentGranted,
    ConsentGrantIn,
    ConsentList,
    ConsentListIn,
    ConsentWithdrawIn,
    ConsentWithdrawn,
)

router = api_router(prefix="/v1/consents", tags=["consent"])


@router.post(
    "", status_code=201, response_model=ConsentGranted, responses=errors(403, 409, 410, 503)
)
def grant_consent(
    body: ConsentGrantIn,
    scope: Scope,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> ConsentGranted:
    """Record the subject's consent for the calling app (creates the subject on first use)."""
    granted = scope.grant_consent(body, idempotency_key=idempotency_key)
    mark_replay(scope, response)
    return granted


@router.post("/list", response_model=ConsentList, responses=errors(403, 404, 410, 503))
def list_consents(body: ConsentListIn, scope: Scope) -> ConsentList:
    """List the consents the subject gave the calling app (never another app's), a page at a
    time: send ``next_cursor`` back as ``cursor`` until it is null."""
    return scope.consents(body)


@router.post(
    "/withdraw", response_model=ConsentWithdrawn, responses=errors(403, 404, 409, 410, 503)
)
def withdraw_consent(
    body: ConsentWithdrawIn,
    scope: Scope,
    response: Response,
    idempotency_key: IdempotencyKey = None,
    prefer: Prefer = None,
) -> ConsentWithdrawn:
    """Withdraw one of the calling app's consents; the next capture or read under it is refused.

    With ``erase``, what was collected under the consent is erased too, and the answer
    carries the signed erasure receipt.
    """
    with client_waits(prefer):
        withdrawn = scope.withdraw_consent(body, idempotency_key=idempotency_key)
    mark_replay(scope, response)
    return withdrawn
