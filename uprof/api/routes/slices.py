"""Profile slices: the gated, token-budgeted part of a profile an app may use."""

from __future__ import annotations

from fastapi import Response

from uprof.api.deps import Scope
from uprof.api.routes.docs import api_router, errors
from uprof.schemas.api import ProfileSlice, SliceIn

router = api_router(prefix="/v1/slices", tags=["slices"])


@router.post("", response_model=ProfileSlice, responses=errors(403, 404, 410, 503))
def create_slice(body: SliceIn, scope: Scope) -> Response:
    """Serve the slice this app may see for a query, within ``budget_tokens``.

    A POST because serving a slice is recorded (a ``SliceServed`` event and an audit
    entry) and because the query and the subject are personal data that must not
    travel in a URL. Items the policy, consent or visibility rule withhold are only
    counted, per reason, in ``withheld``.
    """
    served = scope.slice(body)
    # Serialised here, once: the model was validated by the scope, and FastAPI's
    # response_model pass would copy and validate it again (the schema still documents it).
    # Server-Timing tells a caller how much of its wait was the kernel's slice itself.
    return Response(
        served.model_dump_json(),
        media_type="application/json",
        headers={"Server-Timing": f"slice;dur={scope.kernel_ms:.3f}"},
    )
