"""Compliance-console sign-in with an API key holding the operator role."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from domain.errors import PermissionDeniedError
from uprof.api.routes.docs import api_router
from uprof.apikeys.store import ROLE_OPERATOR, ApiKeyStore
from uprof.web.pages import (
    OPERATOR_COOKIE,
    WebPages,
    key_door,
    operator_door,
    operator_key_stands,
)
from uprof.web.state import Session


def router(web: WebPages) -> APIRouter:
    """Console login and logout."""
    router = api_router()

    @router.get("/console/login", include_in_schema=False)
    def console_login_form(request: Request) -> Response:
        return web.page(request, "console_login.html")

    @router.post("/console/login", include_in_schema=False)
    def console_login(request: Request, api_key: Annotated[str, Form()] = "") -> Response:
        refused = web.cross_site(request)
        if refused is not None:
            return refused
        keys: ApiKeyStore = request.app.state.api_keys
        principal = keys.authenticate(api_key)
        if principal is None:
            return web.page(
                request,
                "console_login.html",
                401,
                error="That API key is unknown, malformed or revoked.",
            )
        # Counted before anything is recorded: a key over its allowance signs in nowhere
        # and writes nothing (an unknown key above names no allowance and no one).
        refused = web.key_counted(request, principal.key_id)
        if refused is not None:
            return refused
        door = key_door(web.runtime_of(request), principal.app_id, principal.key_id)
        if not principal.has_role(ROLE_OPERATOR):
            door.console_sign_in(refused=True)
            return web.message(
                request,
                403,
                "Forbidden",
                f"The key of {principal.app_id} lacks the operator role; "
                "the compliance console needs it.",
            )
        session = Session(kind="operator", app_id=principal.app_id, key_id=principal.key_id)

        def key_stands() -> None:
            if not operator_key_stands(request, session):
                raise PermissionDeniedError("the console's API key was revoked")

        # Asked where the entry takes its place in the log (its write lock; its row read
        # now): a key revoked while the sign-in waited for the log's turn got a session
        # (bug TV), and then a `console.signed_in` entry for a session never given (bug
        # UQ). It now gets `console.sign_in_refused` and no session; a revocation after
        # the entry is on the log after it, and ends the session at its next page.
        try:
            door.console_sign_in(key_stands=key_stands)
        except PermissionDeniedError:
            return web.message(request, 403, "Forbidden", "Your API key is no longer valid.")
        sessions = web.sessions(request)
        sessions.drop(request.cookies.get(OPERATOR_COOKIE), "operator")
        sid = sessions.create(session)
        response = RedirectResponse("/console", status_code=303)
        web.set_cookie(request, response, OPERATOR_COOKIE, sid, "/console")
        return response

    @router.post("/console/logout", include_in_schema=False)
    def console_logout(request: Request, csrf: Annotated[str, Form()] = "") -> Response:
        session = web.operator_session(request)
        if session is not None and not session.csrf_ok(csrf):
            return web.bad_csrf(request)
        web.sessions(request).drop(request.cookies.get(OPERATOR_COOKIE), "operator")
        if session is not None:
            # After the drop: a sign-out never waits on the log. A cookie already signed
            # out, or none, names no session and is not recorded.
            operator_door(request, session).console_sign_out()
        response = RedirectResponse("/console/login", status_code=303)
        response.delete_cookie(OPERATOR_COOKIE, path="/console")
        return response

    return router
