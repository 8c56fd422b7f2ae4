"""Routes of the privacy center (``/privacy``), the compliance console (``/console``) and
the one JSON endpoint that issues privacy-center sign-in links (``POST /v1/privacy/links``).

Rules these handlers keep:

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
"""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Form, Request, UploadFile
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel, ConfigDict

from domain.errors import UprofError
from domain.values import CATEGORIES
from policies.rules import ACTIONS as POLICY_ACTIONS
from policies.rules import app_id_problem
from uprof.api.deps import CurrentPrincipal
from uprof.api.errors import EdgeError, classify, role_required
from uprof.api.keys import ROLE_OPERATOR, ApiKeyStore
from uprof.api.routes.docs import errors
from uprof.api.runtime import ServiceRuntime
from uprof.facade import Facade, Principal, PrincipalKind
from uprof.schemas.api import SubjectRef
from uprof.web.state import LinkStore, Session, SessionStore

_HERE = Path(__file__).parent
USER_COOKIE = "uprof_privacy"
OPERATOR_COOKIE = "uprof_console"
MAX_UPLOAD_BYTES = 20 * 1024 * 1024
MAX_AUDIT_ROWS = 500
#: How a privacy-center principal is named (audit: ``privacy-center#link``).
PRIVACY_CENTER = "privacy-center"
MAX_POLICY_HISTORY = 200

_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'none'; style-src 'self'; img-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}


class PrivacyLinkIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    subject: SubjectRef


class PrivacyLinkOut(BaseModel):
    """A single-use sign-in link for the subject's privacy center."""

    token: str
    expires_at: datetime
    login_path: str


def _fmt_time(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return "" if value is None else str(value)


def _parse_time(raw: str) -> str | None:
    """A form time (``datetime-local`` or RFC 3339) as RFC 3339 UTC; empty gives None."""
    raw = raw.strip()
    if not raw:
        return None
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError as error:
        raise ValueError(f"not a date and time: {raw!r}") from error
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def create_router() -> APIRouter:
    """Build the web router with its own link and session stores."""
    links = LinkStore()
    sessions = SessionStore()
    templates = Jinja2Templates(directory=str(_HERE / "templates"))
    templates.env.filters["when"] = _fmt_time
    css = (_HERE / "static" / "style.css").read_text(encoding="utf-8")
    router = APIRouter()

    def runtime_of(request: Request) -> ServiceRuntime:
        runtime: ServiceRuntime = request.app.state.runtime
        return runtime

    def page(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        response = templates.TemplateResponse(request, name, context, status_code=status)
        response.headers.update(_SECURITY_HEADERS)
        return response

    def message(request: Request, status: int, title: str, text: str, **extra: Any
                ) -> HTMLResponse:
        return page(request, "message.html", status, title=title, text=text, **extra)

    def set_cookie(request: Request, response: Response, name: str, value: str, path: str
                   ) -> None:
        response.set_cookie(name, value, httponly=True, samesite="strict", path=path,
                            secure=request.url.scheme == "https")

    # ------------------------------------------------------------------- static

    @router.get("/web/style.css", include_in_schema=False)
    def stylesheet() -> Response:
        return Response(css, media_type="text/css",
                        headers={"Cache-Control": "max-age=300",
                                 "X-Content-Type-Options": "nosniff"})

    # ---------------------------------------------------------- sign-in links

    @router.post("/v1/privacy/links", status_code=201, response_model=PrivacyLinkOut,
                 responses=errors(403, 404, 410), tags=["privacy"])
    def issue_privacy_link(
        body: PrivacyLinkIn, principal: CurrentPrincipal, request: Request
    ) -> PrivacyLinkOut:
        """Issue a single-use, expiring sign-in link to the subject's privacy center.

        Needs the ``operator`` role. Only the token's hash is kept; hand the token to the
        subject (it opens ``/privacy/login?token=...``).
        """
        if not principal.has_role(ROLE_OPERATOR):
            raise role_required(ROLE_OPERATOR)
        door = _key_door(runtime_of(request), principal.app_id, principal.key_id)
        if not door.subject_exists(body.subject):
            raise EdgeError(404, "subject_not_found", "no such subject")
        token, expires_at = links.issue(body.subject.strip())
        return PrivacyLinkOut(token=token, expires_at=expires_at,
                              login_path=f"/privacy/login?token={token}")

    # ------------------------------------------------------------ privacy center

    def user_session(request: Request) -> Session | None:
        return sessions.get(request.cookies.get(USER_COOKIE), "user")

    def need_user(request: Request) -> Session | HTMLResponse:
        session = user_session(request)
        if session is None:
            return message(request, 401, "Sign-in needed",
                           "Open the sign-in link you were given to reach your privacy center.")
        return session

    def bad_csrf(request: Request) -> HTMLResponse:
        return message(request, 403, "Form expired",
                       "This form is not from your current session. Reload the page and retry.")

    def kernel_error(request: Request, error: UprofError) -> HTMLResponse:
        status, _ = classify(error)
        return message(request, status, "Request refused", str(error))

    @router.get("/privacy/login", include_in_schema=False)
    def privacy_login(request: Request, token: str = "") -> Response:
        subject = links.redeem(token)
        if subject is None:
            return message(request, 403, "Link not valid",
                           "This sign-in link is unknown, already used or expired. "
                           "Ask for a new one.")
        sessions.drop(request.cookies.get(USER_COOKIE))
        sid = sessions.create(Session(kind="user", subject=subject))
        # A page (not a redirect) so the cookie is same-site on the next request even when
        # the link was opened from another site (SameSite=Strict).
        response = page(request, "signed_in.html", target="/privacy")
        set_cookie(request, response, USER_COOKIE, sid, "/privacy")
        return response

    @router.post("/privacy/logout", include_in_schema=False)
    def privacy_logout(request: Request, csrf: Annotated[str, Form()] = "") -> Response:
        session = user_session(request)
        if session is not None and not session.csrf_ok(csrf):
            return bad_csrf(request)
        sessions.drop(request.cookies.get(USER_COOKIE))
        response = message(request, 200, "Signed out", "You are signed out.")
        response.delete_cookie(USER_COOKIE, path="/privacy")
        return response

    def profile_context(runtime: ServiceRuntime, session: Session) -> dict[str, Any]:
        door = _user_door(runtime, session)
        subject = session.subject
        with runtime.pipeline():
            view = door.subject_view(subject)
            cited = {e for a in view.attributes for e in a.evidence}
            cited |= {e for m in view.memories for e in m.evidence}
            cited |= {e for i in view.intents for e in i.evidence}
            captures = door.evidence_captures(subject, cited)
            read_rows = door.item_reads(subject)
        reads: dict[str, list[dict[str, Any]]] = {}
        for item_id, app_id, purpose, n, at in read_rows:
            reads.setdefault(item_id, []).append(
                {"app_id": app_id, "purpose": purpose, "reads": n, "last_read_at": at})
        for entries in reads.values():
            entries.sort(key=lambda r: r["last_read_at"], reverse=True)

        def item(layer: str, row: Any, label: str, detail: str) -> dict[str, Any]:
            return {
                "layer": layer, "id": row.item_id, "label": label, "detail": detail,
                "category": row.category, "provenance": row.provenance,
                "evidence": [captures[e] for e in row.evidence if e in captures],
                "reads": reads.get(row.item_id, []),
            }

        layers = [
            ("Attributes", "What you are, as stated or inferred", [
                item("attribute", a, f"{a.key}: {a.value}",
                     f"{a.status}, confidence {a.confidence:.2f}") for a in view.attributes]),
            ("Memories", "Things that happened or were said", [
                item("memory", m, m.text,
                     f"{m.kind}{', archived' if m.archived else ''}") for m in view.memories]),
            ("Intents", "What you want to do", [
                item("intent", i, i.description, f"{i.status}, confidence {i.confidence:.2f}")
                for i in view.intents]),
        ]
        consents = sorted(view.consents, key=lambda c: (c.withdrawn_at is not None, c.app_id))
        return {"layers": layers, "consents": consents}

    @router.get("/privacy", include_in_schema=False)
    def privacy_home(request: Request) -> Response:
        session = need_user(request)
        if isinstance(session, HTMLResponse):
            return session
        runtime = runtime_of(request)
        try:
            context = profile_context(runtime, session)
        except UprofError as error:
            status, _ = classify(error)
            if session.receipts:  # erased: what is left is the receipts
                return RedirectResponse("/privacy/receipts", status_code=303)
            return message(request, status, "Profile not available", str(error))
        return page(request, "privacy.html", session=session, categories=("*", *CATEGORIES),
                    notice=request.query_params.get("notice", ""), **context)

    def checked_user(request: Request, csrf: str) -> Session | HTMLResponse:
        session = need_user(request)
        if isinstance(session, HTMLResponse):
            return session
        if not session.csrf_ok(csrf):
            return bad_csrf(request)
        return session

    def own_consent(runtime: ServiceRuntime, session: Session, consent_id: str) -> bool:
        with runtime.pipeline():
            consents = _user_door(runtime, session).consents(session.subject)
        return any(c.consent_id == consent_id for c in consents)

    @router.post("/privacy/consents/withdraw", include_in_schema=False)
    def privacy_withdraw(
        request: Request,
        csrf: Annotated[str, Form()] = "",
        consent_id: Annotated[str, Form()] = "",
        erase: Annotated[str, Form()] = "",
    ) -> Response:
        session = checked_user(request, csrf)
        if isinstance(session, HTMLResponse):
            return session
        runtime = runtime_of(request)
        subject = session.subject
        try:
            if not own_consent(runtime, session, consent_id):
                return message(request, 404, "No such consent",
                               "You gave no consent with that id.")
            door = _user_door(runtime, session)
            result = runtime.call_waiting(
                lambda: door.withdraw_consent(subject, consent_id, erase=bool(erase)))
            runtime.wake()
        except UprofError as error:
            return kernel_error(request, error)
        if result is not None:
            session.receipts.append(_receipt_record(result, "consent withdrawal"))
        return RedirectResponse("/privacy?notice=withdrawn", status_code=303)

    @router.post("/privacy/consents/grant", include_in_schema=False)
    def privacy_grant(
        request: Request,
        csrf: Annotated[str, Form()] = "",
        app_id: Annotated[str, Form()] = "",
        category: Annotated[str, Form()] = "",
        purpose: Annotated[str, Form()] = "",
    ) -> Response:
        session = checked_user(request, csrf)
        if isinstance(session, HTMLResponse):
            return session
        app_id, category, purpose = app_id.strip(), category.strip(), purpose.strip()
        problem = app_id_problem(app_id) or ("" if purpose else "a purpose is needed")
        if category not in ("*", *CATEGORIES):
            problem = problem or f"unknown category {category!r}"
        if problem:
            return message(request, 422, "Consent not recorded", problem)
        runtime = runtime_of(request)
        try:
            _user_door(runtime, session).grant_consent(
                session.subject, app_id=app_id, categories=[category], purposes=[purpose])
            runtime.wake()
        except UprofError as error:
            return kernel_error(request, error)
        return RedirectResponse("/privacy?notice=granted", status_code=303)

    @router.get("/privacy/erase", include_in_schema=False)
    def privacy_erase_confirm(request: Request, item_id: str = "") -> Response:
        session = need_user(request)
        if isinstance(session, HTMLResponse):
            return session
        target = None
        if item_id:
            try:
                context = profile_context(runtime_of(request), session)
            except UprofError as error:
                return kernel_error(request, error)
            target = next((i for _, _, items in context["layers"] for i in items
                           if i["id"] == item_id), None)
            if target is None:
                return message(request, 404, "No such item", "Your profile has no such item.")
        return page(request, "privacy_erase.html", session=session, target=target)

    @router.post("/privacy/erase", include_in_schema=False)
    def privacy_erase(
        request: Request,
        csrf: Annotated[str, Form()] = "",
        item_id: Annotated[str, Form()] = "",
        with_evidence: Annotated[str, Form()] = "",
        confirm: Annotated[str, Form()] = "",
    ) -> Response:
        session = checked_user(request, csrf)
        if isinstance(session, HTMLResponse):
            return session
        if confirm != "yes":
            return message(request, 400, "Not confirmed",
                           "Tick the confirmation box to erase.")
        runtime = runtime_of(request)
        door = _user_door(runtime, session)
        subject = session.subject
        try:
            if item_id:
                result = runtime.call_waiting(lambda: door.erase_item(
                    subject, item_id, with_evidence=bool(with_evidence)))
                scope = "one item"
            else:
                result = runtime.call_waiting(lambda: door.erase_subject(subject))
                scope = "everything"
        except UprofError as error:
            return kernel_error(request, error)
        session.receipts.append(_receipt_record(result, scope))
        return RedirectResponse("/privacy/receipts", status_code=303)

    @router.get("/privacy/receipts", include_in_schema=False)
    def privacy_receipts(request: Request) -> Response:
        session = need_user(request)
        if isinstance(session, HTMLResponse):
            return session
        return page(request, "privacy_receipts.html", session=session,
                    receipts=list(enumerate(session.receipts)))

    @router.get("/privacy/receipts/{number}/receipt.json", include_in_schema=False)
    def privacy_receipt_file(request: Request, number: int) -> Response:
        session = need_user(request)
        if isinstance(session, HTMLResponse):
            return session
        if not 0 <= number < len(session.receipts):
            return message(request, 404, "No such receipt", "No receipt with that number.")
        record = session.receipts[number]
        return _download(json.dumps(record["receipt"], indent=2, sort_keys=True),
                         f"erasure-receipt-{record['receipt_id']}.json", "application/json")

    @router.get("/privacy/export.json", include_in_schema=False)
    def privacy_export(request: Request) -> Response:
        session = need_user(request)
        if isinstance(session, HTMLResponse):
            return session
        runtime = runtime_of(request)
        try:
            with runtime.pipeline():
                export = _user_door(runtime, session).export_subject(session.subject)
        except UprofError as error:
            return kernel_error(request, error)
        return _download(json.dumps(export, indent=2, sort_keys=True, default=str),
                         "my-profile-export.json", "application/json")

    # ---------------------------------------------------------- compliance console

    def operator_session(request: Request) -> Session | None:
        return sessions.get(request.cookies.get(OPERATOR_COOKIE), "operator")

    def need_operator(request: Request) -> Session | Response:
        session = operator_session(request)
        if session is None:
            return RedirectResponse("/console/login", status_code=303)
        # The key may have been revoked since sign-in: sessions die with their key.
        keys: ApiKeyStore = request.app.state.api_keys
        alive = any(k.key_id == session.key_id and not k.is_revoked
                    and ROLE_OPERATOR in k.roles for k in keys.list(session.app_id))
        if not alive:
            sessions.drop(request.cookies.get(OPERATOR_COOKIE))
            return message(request, 403, "Forbidden", "Your API key is no longer valid.")
        return session

    def checked_operator(request: Request, csrf: str) -> Session | Response:
        session = need_operator(request)
        if isinstance(session, Response):
            return session
        if not session.csrf_ok(csrf):
            return bad_csrf(request)
        return session

    @router.get("/console/login", include_in_schema=False)
    def console_login_form(request: Request) -> Response:
        return page(request, "console_login.html")

    @router.post("/console/login", include_in_schema=False)
    def console_login(request: Request, api_key: Annotated[str, Form()] = "") -> Response:
        keys: ApiKeyStore = request.app.state.api_keys
        principal = keys.authenticate(api_key)
        if principal is None:
            return page(request, "console_login.html", 401,
                        error="That API key is unknown, malformed or revoked.")
        if not principal.has_role(ROLE_OPERATOR):
            return message(request, 403, "Forbidden",
                           f"The key of {principal.app_id} lacks the operator role; "
                           "the compliance console needs it.")
        sessions.drop(request.cookies.get(OPERATOR_COOKIE))
        sid = sessions.create(Session(kind="operator", app_id=principal.app_id,
                                      key_id=principal.key_id))
        response = RedirectResponse("/console", status_code=303)
        set_cookie(request, response, OPERATOR_COOKIE, sid, "/console")
        return response

    @router.post("/console/logout", include_in_schema=False)
    def console_logout(request: Request, csrf: Annotated[str, Form()] = "") -> Response:
        session = operator_session(request)
        if session is not None and not session.csrf_ok(csrf):
            return bad_csrf(request)
        sessions.drop(request.cookies.get(OPERATOR_COOKIE))
        response = RedirectResponse("/console/login", status_code=303)
        response.delete_cookie(OPERATOR_COOKIE, path="/console")
        return response

    def audit_filter(request: Request, door: Facade) -> tuple[dict[str, str], dict[str, Any]]:
        """The search form's values and the matching ``AuditLog.entries`` arguments."""
        q = request.query_params
        form = {name: q.get(name, "").strip()
                for name in ("subject", "app", "action", "since", "until")}
        subject = form["subject"]
        subject_ref = door.audit_subject_ref(subject) if subject else None
        args = {
            "subject_ref": subject_ref,
            "app_id": form["app"] or None,
            "action": form["action"] or None,
            "since": _parse_time(form["since"]),
            "until": _parse_time(form["until"]),
        }
        return form, args

    @router.get("/console", include_in_schema=False)
    def console_audit(request: Request) -> Response:
        session = need_operator(request)
        if isinstance(session, Response):
            return session
        door = _operator_door(runtime_of(request), session)
        rows: list[Any] = []
        error = ""
        searched = bool(request.query_params)
        try:
            form, args = audit_filter(request, door)
            entries = door.audit_entries(**args)  # reads served before it are in it
            rows = list(itertools.islice(entries, MAX_AUDIT_ROWS + 1))
        except (UprofError, ValueError) as problem:
            form = {k: request.query_params.get(k, "") for k in
                    ("subject", "app", "action", "since", "until")}
            error = str(problem)
            args = {}
        truncated = len(rows) > MAX_AUDIT_ROWS
        shown = [(r.leaf_index, r.entry) for r in rows[:MAX_AUDIT_ROWS]]
        query = str(request.url.query)
        return page(request, "console_audit.html", session=session, form=form, rows=shown,
                    truncated=truncated, error=error, searched=searched, query=query,
                    subject_ref=args.get("subject_ref") or "")

    @router.get("/console/audit/export", include_in_schema=False)
    def console_export(request: Request, format: str = "jsonl") -> Response:
        session = need_operator(request)
        if isinstance(session, Response):
            return session
        door = _operator_door(runtime_of(request), session)
        try:
            form, args = audit_filter(request, door)
            out = io.StringIO()
            door.export_audit(
                out, fmt="csv" if format == "csv" else "jsonl", subject=form["subject"] or None,
                app_id=args["app_id"], action=args["action"], since=args["since"],
                until=args["until"],
            )
        except (UprofError, ValueError) as problem:
            return message(request, 422, "Export refused", str(problem))
        ext = "csv" if format == "csv" else "jsonl"
        media = "text/csv" if ext == "csv" else "application/x-ndjson"
        return _download(out.getvalue(), f"audit-trail.{ext}", media)

    @router.get("/console/public-key.pem", include_in_schema=False)
    def console_public_key(request: Request) -> Response:
        session = need_operator(request)
        if isinstance(session, Response):
            return session
        pem = _operator_door(runtime_of(request), session).audit_key()["public_key_pem"]
        return _download(pem, "audit-public-key.pem", "application/x-pem-file")

    @router.get("/console/verify", include_in_schema=False)
    def console_verify_form(request: Request) -> Response:
        session = need_operator(request)
        if isinstance(session, Response):
            return session
        return page(request, "console_verify.html", session=session, result=None,
                    origin=_operator_door(runtime_of(request), session).audit_key()["origin"])

    @router.post("/console/verify", include_in_schema=False)
    async def console_verify(
        request: Request,
        upload: UploadFile,
        csrf: Annotated[str, Form()] = "",
        kind: Annotated[str, Form()] = "export",
    ) -> Response:
        session = checked_operator(request, csrf)
        if isinstance(session, Response):
            return session
        raw = await upload.read(MAX_UPLOAD_BYTES + 1)
        door = _operator_door(runtime_of(request), session)
        result = _verify(raw, kind, door, upload.filename or "upload")
        status = 200 if result["ok"] else 422
        return page(request, "console_verify.html", status, session=session, result=result,
                    origin=door.audit_key()["origin"])

    @router.get("/console/receipts", include_in_schema=False)
    def console_receipts(request: Request) -> Response:
        session = need_operator(request)
        if isinstance(session, Response):
            return session
        from audit.receipts import RECEIPT_ACTION

        door = _operator_door(runtime_of(request), session)
        entries = door.audit_entries(action=RECEIPT_ACTION)
        rows = [(e.leaf_index, e.recorded_at, e.entry)
                for e in itertools.islice(entries, MAX_AUDIT_ROWS)]
        return page(request, "console_receipts.html", session=session, rows=rows,
                    report=None, terms="")

    @router.post("/console/residue", include_in_schema=False)
    def console_residue(
        request: Request,
        csrf: Annotated[str, Form()] = "",
        terms: Annotated[str, Form()] = "",
    ) -> Response:
        session = checked_operator(request, csrf)
        if isinstance(session, Response):
            return session
        from audit.receipts import RECEIPT_ACTION

        wanted = [t.strip() for t in terms.splitlines() if t.strip()]
        door = _operator_door(runtime_of(request), session)
        if not wanted:
            report = None
            error = "Give at least one term, one per line."
        else:
            report, error = door.residue_scan(wanted), ""
        entries = door.audit_entries(action=RECEIPT_ACTION)
        rows = [(e.leaf_index, e.recorded_at, e.entry)
                for e in itertools.islice(entries, MAX_AUDIT_ROWS)]
        return page(request, "console_receipts.html", session=session, rows=rows,
                    report=report, terms=terms, error=error)

    def policy_page(request: Request, session: Session, status: int = 200, *,
                    error: str = "", done: str = "", form: dict[str, str] | None = None
                    ) -> Response:
        runtime = runtime_of(request)
        table: Callable[[str], Any] | None = getattr(runtime.authorizer, "policy_table", None)
        tenant = runtime.kernel.subjects.tenant
        by_app: dict[str, list[Any]] = {}
        if table is not None:
            for row in table(tenant):
                by_app.setdefault(row.app, []).append(row)
        state, history = None, []
        door = _operator_door(runtime, session)
        problem = door.policy_health()
        if not problem:
            try:
                state = door.policy_show()
                history = list(reversed(door.policy_history()))[:MAX_POLICY_HISTORY]
            except UprofError as failure:
                problem = str(failure)
        return page(request, "console_policy.html", status, session=session, tenant=tenant,
                    by_app=sorted(by_app.items()), available=table is not None,
                    state=state, history=history, problem=problem, error=error, done=done,
                    form=form or {}, actions=POLICY_ACTIONS, categories=CATEGORIES)

    @router.get("/console/policy", include_in_schema=False)
    def console_policy(request: Request) -> Response:
        session = need_operator(request)
        if isinstance(session, Response):
            return session
        return policy_page(request, session)

    @router.post("/console/policy/{verb}", include_in_schema=False)
    def console_policy_change(
        request: Request,
        verb: str,
        csrf: Annotated[str, Form()] = "",
        app_id: Annotated[str, Form()] = "",
        role: Annotated[str, Form()] = "",
        actions: Annotated[list[str] | None, Form()] = None,
        categories: Annotated[list[str] | None, Form()] = None,
        purpose: Annotated[str, Form()] = "",
        effect: Annotated[str, Form()] = "allow",
    ) -> Response:
        session = checked_operator(request, csrf)
        if isinstance(session, Response):
            return session
        if verb not in ("grant", "revoke"):
            return message(request, 404, "Not found", "No such policy change.")
        door = _operator_door(runtime_of(request), session)
        form = {"app_id": app_id, "role": role, "purpose": purpose, "effect": effect}
        change = door.policy_grant if verb == "grant" else door.policy_revoke
        try:
            result = change(
                app_id=app_id.strip() or None, role=role.strip() or None,
                actions=[a for a in actions or () if a],
                categories=[c for c in categories or () if c],
                purpose=purpose.strip() or None, effect=effect.strip() or "allow",
            )
        except UprofError as failure:
            status, _ = classify(failure)
            return policy_page(request, session, status, error=str(failure), form=form)
        done = (f"{verb}: {len(result.changes)} change(s) recorded, policy version "
                f"{result.version}" if result.changes else
                f"nothing to {verb}: the policy already says so")
        return policy_page(request, session, done=done)

    return router


def _receipt_record(result: Any, scope: str) -> dict[str, Any]:
    body = result.receipt.get("body", {})
    return {
        "receipt": result.receipt,
        "receipt_id": str(body.get("receipt_id", "receipt")),
        "issued_at": str(body.get("issued_at", "")),
        "nonce": result.subject_nonce_hex,
        "counts": dict(result.counts),
        "scope": scope,
    }


def _download(text: str, filename: str, media_type: str) -> Response:
    return PlainTextResponse(
        text, media_type=media_type,
        headers={"Content-Disposition": f'attachment; filename="{filename}"',
                 "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"},
    )


def _verify(raw: bytes, kind: str, door: Facade, filename: str) -> dict[str, Any]:
    """Verify an uploaded export or receipt; say exactly where it fails."""
    from dataclasses import asdict

    if len(raw) > MAX_UPLOAD_BYTES:
        return {"ok": False, "kind": kind, "filename": filename, "line_number": None,
                "leaf_index": None, "detail": "the file is too large", "line_text": ""}
    checked = door.verify_audit(raw, "receipt" if kind == "receipt" else "export")
    return {**asdict(checked), "filename": filename}


def _user_door(runtime: ServiceRuntime, session: Session) -> Facade:
    """The facade for a privacy-center session: a data subject, for its one subject."""
    return Facade(runtime.kernel, Principal(
        tenant=runtime.kernel.subjects.tenant, app_id=PRIVACY_CENTER, key_id="link",
        kind=PrincipalKind.USER, subject=session.subject,
    ))


def _key_door(runtime: ServiceRuntime, app_id: str, key_id: str) -> Facade:
    """The facade for an operator API key (console sessions, link issuing)."""
    return Facade(runtime.kernel, Principal(
        tenant=runtime.kernel.subjects.tenant, app_id=app_id, key_id=key_id,
        kind=PrincipalKind.APP, roles=frozenset({ROLE_OPERATOR}),
    ))


def _operator_door(runtime: ServiceRuntime, session: Session) -> Facade:
    return _key_door(runtime, session.app_id, session.key_id)

