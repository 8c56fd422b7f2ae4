"""What the route declarations share: their router and error responses (for the OpenAPI
document)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.routing import APIRoute

from uprof.schemas.api import ErrorOut


def operation_id(route: APIRoute) -> str:
    """A route's OpenAPI operation id: its function's name (generated clients keep their
    method names)."""
    return route.name


def api_router(**options: Any) -> APIRouter:
    """An ``APIRouter`` whose routes are built as the app serves them.

    The app holds these routes themselves (``uprof.api.app.create_app``), not an
    inclusion of their router, so each route is analysed once, when it is declared:
    with fastapi 0.165 an included router's routes are analysed again for each app, on
    its first request (decision 0044-start-cost). Everything an inclusion would set
    must therefore be set here, the operation ids first. The routes are shared by every
    app of the process and carry no app: an app's ``dependency_overrides`` would not
    reach them (uprof overrides no dependency).
    """
    return APIRouter(generate_unique_id_function=operation_id, **options)


_DESCRIPTIONS = {
    400: "The body is not valid UTF-8 JSON (`malformed_body`).",
    401: "Missing, invalid or revoked API key.",
    403: "Refused: consent, policy or the key's role.",
    404: "No such subject or item.",
    409: (
        "The change conflicts with the item's state, or the `Idempotency-Key` was already "
        "used for a different request (`idempotency_key_reused`)."
    ),
    410: "The subject was erased.",
    413: "The request body is over the size limit.",
    429: "This API key is over its rate limit (`rate_limited`); retry after `Retry-After` s.",
    422: "Invalid input; `error.fields` names each offending field.",
    503: "Not taken now (`error.code` says why; `Retry-After` when given); retry later.",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` entry for the given error statuses.

    400, 401, 413, 422, 429 (rate limit) and 503 (the rate-limit counters did not
    answer: ``rate_limit_unavailable``) apply to every authenticated route. Routes that
    act through the facade add 403 (policy decides every action, deny by default) and
    503 for their own reasons (a read that cannot be recorded in the audit log, a view
    that does not catch up in time, a backlogged writer); the schemathesis run checks that
    no route answers a status it does not declare.
    """
    wanted = sorted({400, 401, 413, 422, 429, 503, *statuses})
    return {s: {"model": ErrorOut, "description": _DESCRIPTIONS[s]} for s in wanted}
