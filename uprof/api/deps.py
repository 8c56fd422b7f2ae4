"""Dependencies of the routes, declared once as ``Annotated`` aliases.

``Scope`` is the one a route needs: it authenticates the request's API key and
binds the key's app to an ``AppScope``. No route reads an app id from anywhere else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Annotated

from fastapi import Depends, Header, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from uprof.api.errors import unauthenticated
from uprof.api.ratelimit import KeyRateLimiter
from uprof.api.runtime import ServiceRuntime
from uprof.api.scoped import AppScope
from uprof.apikeys.store import ApiKeyStore, NeedsRead, Principal
from uprof.facade import STREAM_RECHECK_RECORDS, client_waits_at_most

#: auto_error=False: a missing header must give our 401 body, not FastAPI's 403.
bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="An API key from `uprof apps create`, sent as `Authorization: Bearer <key>`.",
)


# The dependencies are ``async def``: FastAPI runs a plain ``def`` dependency on a worker
# thread, one thread hop each, and these only read what the app already holds.


async def get_runtime(request: Request) -> ServiceRuntime:
    runtime: ServiceRuntime = request.app.state.runtime
    return runtime


async def get_key_store(request: Request) -> ApiKeyStore:
    store: ApiKeyStore = request.app.state.api_keys
    return store


Runtime = Annotated[ServiceRuntime, Depends(get_runtime)]
KeyStore = Annotated[ApiKeyStore, Depends(get_key_store)]


async def authenticate(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> Principal:
    """Return the principal of the request's API key, or refuse with 401 (429 when the
    key is over its rate limit: counted after authentication, so a stranger cannot use
    up an app's allowance).

    A key whose row was read within the last seconds is checked on the event loop;
    otherwise the row is read on a worker thread, so the loop never waits on a query.
    """
    if credentials is None:
        raise unauthenticated("missing API key")
    # Read from the app's state, not through the KeyStore dependency: each dependency
    # FastAPI resolves costs every request of every route that authenticates.
    store: ApiKeyStore = request.app.state.api_keys
    principal = store.authenticate_cached(credentials.credentials)
    if isinstance(principal, NeedsRead):
        principal = await run_in_threadpool(store.authenticate, credentials.credentials)
    if principal is None:
        raise unauthenticated("invalid or revoked API key")
    limiter: KeyRateLimiter | None = request.app.state.rate_limiter
    if limiter is not None:
        # A database transaction that may wait (the views file's write lock, the bucket's
        # lock, a pooled connection): in the thread pool, never on the loop, where its
        # wait held up every other request of the process (review of 0115, bug BF).
        await run_in_threadpool(limiter.check, principal.key_id)
    return principal


CurrentPrincipal = Annotated[Principal, Depends(authenticate)]


async def app_scope(request: Request, principal: CurrentPrincipal) -> AppScope:
    runtime: ServiceRuntime = request.app.state.runtime
    store: ApiKeyStore = request.app.state.api_keys
    return AppScope(
        runtime,
        principal.app_id,
        principal.roles,
        key_id=principal.key_id,
        still_authenticated=key_still_live(store, principal.key_id),
    )


Scope = Annotated[AppScope, Depends(app_scope)]


IDEMPOTENCY_DESCRIPTION = (
    "Optional. A key of your choosing (1-255 visible ASCII characters, e.g. a UUID) that "
    "makes this write safe to retry: the first request with a key is executed once and "
    "its answer kept (24 h by default, per app: another app's keys are never seen); a "
    "retry with the same key and the same body gets that same answer (same ids, same "
    "status, header `Idempotent-Replayed: true`) and writes nothing; the same key with "
    "a different body is refused with 409 `idempotency_key_reused`."
)

#: The ``Idempotency-Key`` request header of the write routes (documented in OpenAPI).
IdempotencyKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", description=IDEMPOTENCY_DESCRIPTION, max_length=255),
]


PREFER_DESCRIPTION = (
    "Optional (RFC 7240). `wait=N`: this client waits N seconds for an answer; a keyed "
    "withdrawal whose first request still runs is answered 409 `request_in_progress` "
    "within that, not after the server's own wait (`UPROF_REQUEST_IN_PROGRESS_WAIT_S`) "
    "when that is longer, and a withdrawal with `erase` behind another erasure of the "
    "same consent 409 `conflict_retry` (both waits within the N seconds together); a "
    "check of the key that has not answered within what is left of them is 503 "
    "`store_unavailable`, nothing written. Other preferences, and a `wait` that is not a "
    "whole number, are ignored."
)

#: The ``Prefer`` request header of the routes that may wait for a first request.
Prefer = Annotated[
    str | None, Header(alias="Prefer", description=PREFER_DESCRIPTION, max_length=1024)
]


def preferred_wait_s(prefer: str | None) -> float | None:
    """The seconds of a ``Prefer`` header's ``wait`` preference (RFC 7240: delta-seconds),
    or None: no header, no ``wait``, or one that is not a whole number of seconds (a
    preference the server does not understand is ignored, RFC 7240 section 2)."""
    for preference in (prefer or "").split(","):
        name, _, value = preference.partition("=")
        if name.strip().lower() != "wait":
            continue
        value = value.split(";")[0].strip().strip('"')
        return float(value) if value.isascii() and value.isdigit() else None
    return None


def client_waits(prefer: str | None) -> contextlib.AbstractContextManager[None]:
    """Serve the request inside this block knowing how long its client waits (bug LV)."""
    return client_waits_at_most(preferred_wait_s(prefer))


def mark_replay(scope: AppScope, response: Response) -> None:
    """Say on the response when a keyed write was answered from its first answer."""
    if scope.replayed:
        response.headers["Idempotent-Replayed"] = "true"


def key_still_live(store: ApiKeyStore, key_id: str) -> Callable[[], None]:
    """A check that raises 401 once the key ``key_id`` is revoked (by any process, seen
    within ``KEY_CACHE_TTL_S``): a request that waits asks it again before it serves.
    Right after authentication it answers from the row the authentication just read."""

    def check() -> None:
        if not store.is_live(key_id):
            raise unauthenticated("the API key was revoked while the request waited")

    return check


def while_key_live(records: Iterable[str], store: ApiKeyStore, token: str) -> Iterator[str]:
    """Yield ``records`` (a response being streamed) while the request's API key stands.

    The key is checked again every ``STREAM_RECHECK_RECORDS`` records: a key revoked
    meanwhile, by any process, ends the stream (the connection is cut) within
    ``KEY_CACHE_TTL_S`` of the revocation, as it refuses the key's next request. The
    stream is closed either way, so its closing audit entry is written.
    """
    return while_live(records, lambda: store.authenticate(token) is not None)


def while_live(records: Iterable[str], still_live: Callable[[], bool]) -> Iterator[str]:
    """``while_key_live`` for any credential: ``still_live()`` is asked every
    ``STREAM_RECHECK_RECORDS`` records (the console asks for its session's key)."""
    it = iter(records)
    try:
        for sent, record in enumerate(it, 1):
            yield record
            if sent % STREAM_RECHECK_RECORDS == 0 and not still_live():
                raise unauthenticated("the API key was revoked while the stream was sent")
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
