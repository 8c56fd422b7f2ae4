"""Profile slices: the gated, token-budgeted part of a profile an app may use."""

from __future__ import annotations

from fastapi import APIRouter

from uprof.api.deps import Scope
from uprof.api.routes.docs import errors
from uprof.schemas.api import ProfileSlice, SliceIn

router = APIRouter(prefix="/v1/slices", tags=["slices"])


@router.post("", response_model=ProfileSlice, responses=errors(404, 410))
def create_slice(body: SliceIn, scope: Scope) -> ProfileSlice:
    """Serve the slice this app may see for a query, within ``budget_tokens``.

    A POST because serving a slice is recorded (a ``SliceServed`` event and an audit
    entry) and because the query and the subject are personal data that must not
    travel in a URL. Items the policy, consent or visibility rule withhold are only
    counted, per reason, in ``withheld``.
    """
    return scope.slice(body)
