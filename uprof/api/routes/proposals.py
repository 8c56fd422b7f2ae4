"""Structured proposals submitted by agents, bound to evidence by the kernel."""

from __future__ import annotations

from fastapi import Response

from uprof.api.deps import IdempotencyKey, Scope, mark_replay
from uprof.api.routes.docs import api_router, errors
from uprof.schemas.api import ProposalsIn, ProposalsResult

router = api_router(prefix="/v1/proposals", tags=["proposals"])


@router.post("", response_model=ProposalsResult, responses=errors(403, 404, 409, 410, 503))
def submit_proposals(
    body: ProposalsIn,
    scope: Scope,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> ProposalsResult:
    """Apply an agent's attribute, memory, intent and experience proposals.

    Evidence must be captures of the same subject (422 otherwise, nothing applied);
    a proposal without evidence is kept as inferred with capped confidence.
    """
    result = scope.submit_proposals(body, idempotency_key=idempotency_key)
    mark_replay(scope, response)
    return result
