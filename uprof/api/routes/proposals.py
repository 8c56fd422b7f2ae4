"""Structured proposals submitted by agents, bound to evidence by the kernel."""

from __future__ import annotations

from fastapi import APIRouter

from uprof.api.deps import Scope
from uprof.api.routes.docs import errors
from uprof.schemas.api import ProposalsIn, ProposalsResult

router = APIRouter(prefix="/v1/proposals", tags=["proposals"])


@router.post("", response_model=ProposalsResult, responses=errors(404, 409, 410))
def submit_proposals(body: ProposalsIn, scope: Scope) -> ProposalsResult:
    """Apply an agent's attribute, memory, intent and experience proposals.

    Evidence must be captures of the same subject (422 otherwise, nothing applied);
    a proposal without evidence is kept as inferred with capped confidence.
    """
    return scope.submit_proposals(body)
