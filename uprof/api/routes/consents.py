"""Consents the calling app holds from subjects: grant, list, withdraw."""

from __future__ import annotations

from fastapi import APIRouter

from uprof.api.deps import Scope
from uprof.api.routes.docs import errors
from uprof.schemas.api import (
    ConsentGranted,
    ConsentGrantIn,
    ConsentList,
    ConsentListIn,
    ConsentWithdrawIn,
    ConsentWithdrawn,
)

router = APIRouter(prefix="/v1/consents", tags=["consent"])


@router.post("", status_code=201, response_model=ConsentGranted, responses=errors(410))
def grant_consent(body: ConsentGrantIn, scope: Scope) -> ConsentGranted:
    """Record the subject's consent for the calling app (creates the subject on first use)."""
    return scope.grant_consent(body)


@router.post("/list", response_model=ConsentList, responses=errors(404, 410))
def list_consents(body: ConsentListIn, scope: Scope) -> ConsentList:
    """List the consents the subject gave the calling app (never another app's)."""
    return scope.consents(body)


@router.post("/withdraw", response_model=ConsentWithdrawn, responses=errors(404, 410))
def withdraw_consent(body: ConsentWithdrawIn, scope: Scope) -> ConsentWithdrawn:
    """Withdraw one of the calling app's consents; the next capture or read under it is refused.

    With ``erase``, what was collected under the consent is erased too, and the answer
    carries the signed erasure receipt.
    """
    return scope.withdraw_consent(body)
