"""Quarantined captures, for operator keys: list them, and extract them again.

A capture whose extraction failed on every attempt is set aside so the pipeline goes on
(docs/reliability.md, "Poison captures"). Both routes go through the door, decided as the
policy's ``operate`` for operators, and are audited (``quarantine.listed``,
``capture.released`` / ``capture.retried``).
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

from domain.errors import UprofError
from uprof.api.deps import Scope
from uprof.api.errors import EdgeError, body_for, classify, retry_after_s, store_refusal
from uprof.api.routes.docs import api_router, errors
from uprof.api.scoped import AppScope
from uprof.apikeys.store import ROLE_OPERATOR
from uprof.facade import Facade, RetryOutcome, retried_before
from uprof.schemas.api import ErrorOut
from uprof.schemas.quarantine import (
    QuarantinedOut,
    QuarantineOut,
    QuarantineRetryIn,
    QuarantineRetryOut,
    QuarantineRetryRefusedOut,
    RetryOutcomeOut,
)

router = api_router(prefix="/v1/quarantine", tags=["operations"])


def _door(scope: AppScope) -> Facade:
    """The facade for the request's operator key, once a key without the operator role
    is refused (audited). The door carries the key's check (``Scope``): a retry asks it
    again in the subject's writer turn, after the model ran, before the release is
    written, so a key revoked meanwhile releases nothing (bug UR)."""
    scope.require_role(ROLE_OPERATOR)
    return scope.door


@router.get("", response_model=QuarantineOut, responses=errors(403))
def list_quarantined(scope: Scope) -> QuarantineOut:
    """Every quarantined capture, oldest first: ids, pseudonym, stage, error class."""
    held = _door(scope).list_quarantined()
    return QuarantineOut(
        captures=[
            QuarantinedOut(
                capture_id=q.capture_id,
                subject_pseudonym=q.subject,
                stage=q.stage,
                error=q.error,
                attempts=q.attempts,
                quarantined_at=q.quarantined_at,
                notification_id=q.notification_id,
            )
            for q in held
        ]
    )


def _partway(status: int) -> dict[str, object]:
    """The documented answer ``status`` of a retry, which may come partway (bug WL)."""
    described = errors(status)[status]
    return {**described, "model": QuarantineRetryRefusedOut}


@router.post(
    "/retry",
    response_model=QuarantineRetryOut,
    responses={**errors(403), 401: _partway(401), 503: _partway(503)},
)
def retry_quarantined(body: QuarantineRetryIn, scope: Scope) -> QuarantineRetryOut | JSONResponse:
    """Extract quarantined captures again (the named ones, or all): each is released
    (its results saved) or stays quarantined, saying with which error class. Refused
    partway (the key revoked while a capture was extracted), the refusal lists the
    captures retried before it (``outcomes``)."""
    try:
        outcomes = _door(scope).retry_quarantined(body.capture_ids)
    except Exception as error:
        done = retried_before(error)
        if not done:
            raise
        return _refused_partway(error, done)
    return QuarantineRetryOut(outcomes=[_outcome(o) for o in outcomes])


def _outcome(o: RetryOutcome) -> RetryOutcomeOut:
    return RetryOutcomeOut(capture_id=o.capture_id, outcome=o.outcome, error=o.error)


def _refused_partway(error: Exception, done: list[RetryOutcome]) -> JSONResponse:
    """The refusal the error handlers give ``error``, with the captures retried before it:
    each release is its own write, so a retry refused at its n-th capture released the
    ones before, and the caller is told which (bug WL). An error no handler maps to a
    refusal (a fault) is raised as it is."""
    headers: dict[str, str] | None = None
    refusal: ErrorOut
    if isinstance(error, EdgeError):
        status, refusal = error.status, error.body()
        if status == 401:
            headers = {"WWW-Authenticate": "Bearer"}
    else:
        mapped = error if isinstance(error, UprofError) else store_refusal(error)
        if mapped is None:
            raise error
        status, _ = classify(mapped)
        refusal = body_for(mapped)
        wait = retry_after_s(mapped)
        headers = None if wait is None else {"Retry-After": str(wait)}
    answer = QuarantineRetryRefusedOut(error=refusal.error, outcomes=[_outcome(o) for o in done])
    return JSONResponse(answer.model_dump(mode="json"), status_code=status, headers=headers)
