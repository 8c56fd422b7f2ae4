"""Privacy-center sign-in: single-use links issued to operators' keys, login, logout.

A link opens a page whose button posts its token back: only that post uses the link and
opens a session (decision 0068-sign-in-by-post)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response
from pydantic import BaseModel, ConfigDict

from domain.errors import SignInLinkInUseError
from uprof.api.deps import CurrentPrincipal
from uprof.api.errors import EdgeError, classify
from uprof.api.routes.docs import api_router, errors
from uprof.api.scoped import scope_with_role
from uprof.apikeys.store import ROLE_OPERATOR
from uprof.schemas.api import SubjectRef
from uprof.web.pages import (
    USER_COOKIE,
    WebPages,
    key_door,
    retry_later,
    user_door,
)
from uprof.web.state import Session

#: Longer tokens are no link (``LinkStore.redeem`` refuses them unread; issued ones are 43).
MAX_TOKEN_CHARS = 200


class PrivacyLinkIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"subject": "alice@example.com"}]}
    )
    subject: SubjectRef


class PrivacyLinkOut(BaseModel):
    """A single-use sign-in link for the subject's privacy center."""

    token: str
    expires_at: datetime
    login_path: str


def router(web: WebPages) -> APIRouter:
    """Link issuing (JSON, operator role) and the privacy-center sign-in pages."""
    router = api_router()

    # ---------------------------------------------------------- sign-in links

    @router.post(
        "/v1/privacy/links",
        status_code=201,
        response_model=PrivacyLinkOut,
        responses=errors(403, 404, 410),
        tags=["privacy"],
    )
    def issue_privacy_link(
        body: PrivacyLinkIn, principal: CurrentPrincipal, request: Request
    ) -> PrivacyLinkOut:
        """Issue a single-use, expiring sign-in link to the subject's privacy center.

        Needs the ``operator`` role, and the operators' policy must allow ``export`` and
        ``erase`` (what the link lets its holder do). Only the token's hash is kept; hand
        the token to the subject (it opens ``/privacy/login?token=...``).
        """
        scope_with_role(
            web.runtime_of(request),
            principal.app_id,
            principal.roles,
            principal.key_id,
            ROLE_OPERATOR,
        )
        door = key_door(web.runtime_of(request), principal.app_id, principal.key_id)
        door.authorize_privacy_link()  # the link can export and erase: so must its issuer
        if not door.subject_exists(body.subject):
            raise EdgeError(404, "subject_not_found", "no such subject")
        pseudonym = door.subject_pseudonym(body.subject) or ""
        incarnation = web.sessions(request).incarnation(pseudonym) if pseudonym else ""
        token, expires_at, link_id = web.links(request).issue(
            body.subject.strip(), incarnation, issued_by=principal.key_id
        )
        # Audited before the token leaves: a link the log cannot show is never handed out.
        door.privacy_link_issued(body.subject, link_id)
        return PrivacyLinkOut(
            token=token, expires_at=expires_at, login_path=f"/privacy/login?token={token}"
        )

    @router.get("/privacy/login", include_in_schema=False)
    def privacy_login_page(request: Request, token: str = "") -> Response:
        # Opening the link uses nothing: mail scanners and link previews fetch it too, and
        # would otherwise burn it and take the session. The button posts it back.
        if not token or len(token) > MAX_TOKEN_CHARS:
            return link_not_valid(request)
        return web.page(request, "privacy_login.html", token=token)

    @router.post("/privacy/login", include_in_schema=False)
    def privacy_login(request: Request, token: Annotated[str, Form()] = "") -> Response:
        refused = web.cross_site(request)
        if refused is not None:
            return refused
        links = web.links(request)
        try:
            redeemed = links.redeem(token)
        except SignInLinkInUseError as in_use:
            return link_in_use(request, in_use)
        if redeemed is None:
            return link_not_valid(request)
        subject, incarnation = redeemed.subject, redeemed.incarnation
        session = Session(
            kind="user",
            subject=subject,
            incarnation=incarnation,
            key_id=redeemed.issued_by,
            link_id=redeemed.link_id,
        )
        # Spent only once decided: a session, or a decided refusal ("Link not valid").
        # Anything that stops the sign-in before (a store did not answer: the policy
        # store, review of 0173 bug MG; the database, bug NH; or the policy store is
        # damaged, bug MY) gives it back unspent, so the same link signs in once the
        # stores answer or are repaired: still at most one session. Until then another
        # press with it is told it is in use (bug NW), never "Link not valid".
        decided = False
        try:
            stands = web.same_incarnation(request, subject, incarnation) and web.issuer_stands(
                request, session
            )
            # Asked after the checks, which may have waited on a store for long: a link
            # that expired meanwhile is dead, as every other press was told (bug OX), and
            # before the browser's earlier session is signed out, so refusing it ends nothing.
            if not stands or not links.still_live(redeemed):
                decided = True
                return link_not_valid(request)
            sessions = web.sessions(request)
            sessions.drop(request.cookies.get(USER_COOKIE), "user")
            sid = sessions.create(session)
            # On the log before the session's cookie leaves (it opens the whole profile),
            # and the last step that can fail: an entry says a session opened. Written
            # before the browser's earlier session was signed out, a failure of that
            # sign-out gave the link back after its entry, and the next press wrote a
            # second one for one session (bug NX).
            user_door(web.runtime_of(request), session).privacy_link_used()
            decided = True
        finally:
            if decided:
                links.spend(token)
            else:
                links.give_back(token, redeemed)
        # Posted from uprof's own page: the redirect stays same-site, so the browser sends
        # the new (SameSite=Strict) cookie with it.
        response = RedirectResponse("/privacy", status_code=303)
        web.set_cookie(request, response, USER_COOKIE, sid, "/privacy")
        return response

    def link_in_use(request: Request, in_use: SignInLinkInUseError) -> Response:
        status, _code = classify(in_use)
        shown = web.message(
            request,
            status,
            "Sign-in in progress",
            "Another sign-in with this link has not finished yet (pressed twice, or in "
            "another tab or browser). The link is not used up: wait a few seconds, then "
            "press Sign in again.",
        )
        return retry_later(shown, in_use)

    def link_not_valid(request: Request) -> Response:
        return web.message(
            request,
            403,
            "Link not valid",
            "This sign-in link is unknown, already used or expired. Ask for a new one.",
        )

    @router.post("/privacy/logout", include_in_schema=False)
    def privacy_logout(request: Request, csrf: Annotated[str, Form()] = "") -> Response:
        session = web.user_session(request)
        if session is not None and not session.csrf_ok(csrf):
            return web.bad_csrf(request)
        web.sessions(request).drop(request.cookies.get(USER_COOKIE), "user")
        response = web.message(request, 200, "Signed out", "You are signed out.")
        response.delete_cookie(USER_COOKIE, path="/privacy")
        return response

    return router
