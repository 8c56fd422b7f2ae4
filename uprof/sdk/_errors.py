"""Errors the SDK raises, the same in HTTP and embedded mode.

UprofClientError
├── TransportError              the server could not be reached or answered garbage
└── APIError                    the service refused or failed; carries status, code, hint, fields
    ├── AuthenticationError     401: missing, invalid or revoked API key
    ├── PermissionDeniedError   403: consent, policy or the key's role refused it
    ├── NotFoundError           404: no such subject, item or consent
    ├── ConflictError           409: the change conflicts with the item's state
    ├── GoneError               410: the subject was erased
    ├── PayloadTooLargeError    413: the request body is over the server's limit
    ├── InvalidRequestError     422: bad input; ``fields`` names each offending field
    ├── ServiceUnavailableError 503: not ready, or a read timed out waiting for projections
    └── ServerError             any other 5xx
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from uprof.schemas.api import FieldProblem


class UprofClientError(Exception):
    """Base of every error the SDK raises.

    ``idempotency_key``: the key an HTTP write was sent with (yours, or the one the client
    made for the call), None for anything else. After a ``TransportError`` (or an error
    answered to one of the client's resends) the write may have been stored: call again
    with the same arguments and ``idempotency_key=error.idempotency_key`` to get its
    answer instead of writing it twice."""

    idempotency_key: str | None = None


class TransportError(UprofClientError):
    """The request did not get an answer from the service (connection, timeout, bad body)."""


class APIError(UprofClientError):
    """The service answered with an error status.

    ``retry_after_s``: how long the service asked to wait before trying again (its
    ``Retry-After``, the same table in embedded mode), None when it did not: a 503
    ``store_unavailable`` (the database did not answer) or ``policy_store_unavailable``
    carries one."""

    status: int = 0

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        hint: str = "",
        fields: Sequence[FieldProblem] = (),
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.status = status
        self.code = code
        self.message = message
        self.hint = hint
        self.fields = list(fields)
        self.retry_after_s = retry_after_s


class AuthenticationError(APIError):
    """401."""


class PermissionDeniedError(APIError):
    """403."""


class NotFoundError(APIError):
    """404."""


class ConflictError(APIError):
    """409."""


class GoneError(APIError):
    """410."""


class PayloadTooLargeError(APIError):
    """413."""


class InvalidRequestError(APIError):
    """422."""


class ServiceUnavailableError(APIError):
    """503."""


class ServerError(APIError):
    """Any other 5xx."""


_BY_STATUS: dict[int, type[APIError]] = {
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    410: GoneError,
    413: PayloadTooLargeError,
    422: InvalidRequestError,
    503: ServiceUnavailableError,
}


def error_for(
    status: int, body: Mapping[str, Any] | None, retry_after_s: float | None = None
) -> APIError:
    """Build the SDK error for a status and an ``ErrorOut``-shaped body (or anything else),
    and the wait the service asked for (``retry_after_s``)."""
    detail = body.get("error") if isinstance(body, Mapping) else None
    if not isinstance(detail, Mapping):
        detail = {"code": "http_error", "message": f"HTTP {status}"}
    fields = [
        FieldProblem.model_validate(f) for f in detail.get("fields", ()) if isinstance(f, Mapping)
    ]
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else APIError)
    return cls(
        status,
        str(detail.get("code", "")),
        str(detail.get("message", "")),
        str(detail.get("hint", "")),
        fields,
        retry_after_s,
    )


def retry_after_header(value: str | None) -> float | None:
    """The seconds of a ``Retry-After`` header (uprof sends delta-seconds), or None."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds >= 0 else None


def invalid_request(problems: Sequence[FieldProblem]) -> InvalidRequestError:
    """The error for input the SDK refuses before sending it (same shape as the server's 422)."""
    summary = "; ".join(f"{p.field}: {p.message}" for p in problems[:5]) or "invalid request"
    return InvalidRequestError(
        422, "invalid_request", summary, "fix the named fields; nothing was stored", problems
    )
