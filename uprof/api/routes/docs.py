"""Error responses shared by the route declarations (for the OpenAPI document)."""

from __future__ import annotations

from typing import Any

from uprof.schemas.api import ErrorOut

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

    400, 401, 413, 422 and 429 (rate limit) apply to every authenticated route.
    Routes that act through the facade add 403 (policy decides every action, deny by
    default) and 503 (a read that cannot be recorded in the audit log, a view that does
    not catch up in time, a backlogged writer); the schemathesis run checks that no
    route answers a status it does not declare.
    """
    wanted = sorted({400, 401, 413, 422, 429, *statuses})
    return {s: {"model": ErrorOut, "description": _DESCRIPTIONS[s]} for s in wanted}
