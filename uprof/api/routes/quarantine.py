"""Quarantined captures, for operator keys: list them, and extract them again.

A capture whose extraction failed on every attempt is set aside so the pipeline goes on
(docs/reliability.md, "Poison captures"). Both routes go through the door, decided as the
policy's ``operate`` for operators, and are audited (``quarantine.listed``,
``capture.released`` / ``capture.retried``).
"""

from __future__ import annotations

from uprof.api.deps import Scope
from uprof.api.routes.docs import api_router, errors
from uprof.api.scoped import AppScope
from uprof.apikeys.store import ROLE_OPERATOR
from uprof.facade import Facade
from uprof.schemas.quarantine import (
    QuarantinedOut,
    QuarantineOut,
    QuarantineRetryIn,
    QuarantineRetryOut,
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


@router.post("/retry", response_model=QuarantineRetryOut, responses=errors(403))
def retry_quarantined(body: QuarantineRetryIn, scope: Scope) -> QuarantineRetryOut:
    """Extract quarantined captures again (the named ones, or all): each is released
    (its results saved) or stays quarantined, saying with which error class."""
    outcomes = _door(scope).retry_quarantined(body.capture_ids)
    return QuarantineRetryOut(
        outcomes=[
            RetryOutcomeOut(capture_id=o.capture_id, outcome=o.outcome, error=o.error)
            for o in outcomes
        ]
    )
