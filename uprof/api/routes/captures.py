"""Capture: interactions enter through the kernel's consent gate."""

from __future__ import annotations

from fastapi import APIRouter

from uprof.api.deps import Scope
from uprof.api.routes.docs import errors
from uprof.schemas.api import CaptureAck, CaptureBatchAck, CaptureBatchIn, CaptureIn

router = APIRouter(prefix="/v1/captures", tags=["capture"])


@router.post("", status_code=201, response_model=CaptureAck, responses=errors(403, 404, 410))
def capture(body: CaptureIn, scope: Scope) -> CaptureAck:
    """Capture one interaction about a subject, as the authenticated app.

    Refused with 403 when the subject gave this app no consent in force for the
    purpose; then nothing is stored.
    """
    return scope.capture(body)


@router.post(
    "/batch", status_code=201, response_model=CaptureBatchAck, responses=errors(403, 404, 410)
)
def capture_batch(body: CaptureBatchIn, scope: Scope) -> CaptureBatchAck:
    """Capture several interactions about one subject in one transaction, all or nothing."""
    return scope.capture_many(body)
