"""Capture: interactions enter through the kernel's consent gate.

The routes are coroutines: a capture waits for the group-commit writer (decision 0017)
on the event loop instead of holding a worker thread (decision 0034-capture-throughput).
"""

from __future__ import annotations

from fastapi import Response

from uprof.api.deps import IdempotencyKey, Scope, mark_replay
from uprof.api.routes.docs import api_router, errors
from uprof.schemas.api import CaptureAck, CaptureBatchAck, CaptureBatchIn, CaptureIn

router = api_router(prefix="/v1/captures", tags=["capture"])


@router.post(
    "", status_code=201, response_model=CaptureAck, responses=errors(403, 404, 409, 410, 503)
)
async def capture(
    body: CaptureIn, scope: Scope, response: Response, idempotency_key: IdempotencyKey = None
) -> CaptureAck:
    """Capture one interaction about a subject, as the authenticated app.

    Refused with 403 when the subject gave this app no consent in force for the
    purpose; then nothing is stored. With an ``Idempotency-Key`` a retry is answered
    with the first answer and captures nothing again.
    """
    ack = await scope.capture_async(body, idempotency_key=idempotency_key)
    mark_replay(scope, response)
    return ack


@router.post(
    "/batch",
    status_code=201,
    response_model=CaptureBatchAck,
    responses=errors(403, 404, 409, 410, 503),
)
async def capture_batch(
    body: CaptureBatchIn,
    scope: Scope,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> CaptureBatchAck:
    """Capture several interactions about one subject in one transaction, all or nothing."""
    acks = await scope.capture_many_async(body, idempotency_key=idempotency_key)
    mark_replay(scope, response)
    return acks
