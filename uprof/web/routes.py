"""Routes of the privacy center (``/privacy``), the compliance console (``/console``) and
the one JSON endpoint that issues privacy-center sign-in links (``POST /v1/privacy/links``).

Rules every page module keeps:

- A privacy-center session is bound at sign-in to ONE subject; every handler takes the
  subject from the session, never from the URL, a query parameter or a form field.
- The console needs a session opened with an API key holding the ``operator`` role; a
  valid key without it gets 403.
- Every state-changing form carries the session's CSRF token, checked before anything
  runs; cookies are HttpOnly and SameSite=Strict.
- Every operation goes through ``uprof.facade.Facade``: privacy-center sessions as a
  data-subject principal bound to their subject, console sessions as the operator key's
  principal (the policy's ``operators`` rows decide), through the runtime like
  ``AppScope`` does (pipeline lock inline, ``call_waiting`` for calls that wait).

What the pages share (templates, stores, replies, session checks) is ``pages.WebPages``;
each area is its own small module with a ``router(web)``.
"""

from __future__ import annotations

import threading

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.routing import BaseRoute

from domain.errors import UprofError
from uprof.api.routes.docs import api_router
from uprof.web import (
    console_audit,
    console_policy,
    console_receipts,
    console_session,
    privacy_erasure,
    privacy_profile,
    privacy_session,
)
from uprof.web.pages import WebPages

#: In the order they are mounted; each adds its own paths.
AREAS = (
    privacy_session,
    privacy_profile,
    privacy_erasure,
    console_session,
    console_audit,
    console_receipts,
    console_policy,
)


def create_router() -> APIRouter:
    """The web router: the privacy center, the console and their stylesheet.

    Its routes are built once per process and shared by every app (each app keeps its
    own link and session stores, ``pages.WebPages``): building them was ~16 ms of CPU per
    app, on top of the REST API's routes (decision 0044-start-cost).
    """
    return api_router(routes=_routes())


#: The paths the pages own (``/v1/privacy/links`` is REST: it answers JSON).
PAGE_PREFIXES = ("/privacy", "/console")


def page_error(request: Request, error: UprofError) -> Response | None:
    """A refusal raised under a page (the door's, from any handler that did not catch
    it) as the refusal page, with the status REST would give; None for other paths."""
    path = request.url.path
    if not any(path == p or path.startswith(p + "/") for p in PAGE_PREFIXES):
        return None
    return _web().kernel_error(request, error)


_ROUTES: list[BaseRoute] = []
_WEB: list[WebPages] = []
_ROUTES_LOCK = threading.Lock()


def _web() -> WebPages:
    with _ROUTES_LOCK:
        if not _WEB:
            _WEB.append(WebPages())
        return _WEB[0]


def _routes() -> list[BaseRoute]:
    web = _web()
    with _ROUTES_LOCK:
        if not _ROUTES:
            _ROUTES.extend(_build_routes(web))
        return list(_ROUTES)


def _build_routes(web: WebPages) -> list[BaseRoute]:
    router = api_router()

    @router.get("/web/style.css", include_in_schema=False)
    def stylesheet() -> Response:
        return Response(
            web.css,
            media_type="text/css",
            headers={"Cache-Control": "max-age=300", "X-Content-Type-Options": "nosniff"},
        )

    # The areas' routes themselves, not inclusions of their routers: an included router's
    # routes would be analysed again by each app, on its first request (``api_router``).
    routes = list(router.routes)
    for area in AREAS:
        routes.extend(area.router(web).routes)
    return routes
