"""What every web page shares: templates, the sign-in link and session stores, the replies
(page, message, download), the session checks, and the facade each kind of session acts
through. The pages themselves live one module per area (``privacy_*``, ``console_*``).
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from domain.errors import PermissionDeniedError, RateLimitUnavailableError, UprofError
from uprof.api.errors import RATE_LIMIT_UNAVAILABLE_RETRY_AFTER_S, classify, retry_after_s
from uprof.api.ratelimit import PRIVACY_LINKS, KeyRateLimiter, RateLimitedError, limiter_for
from uprof.api.runtime import ServiceRuntime
from uprof.apikeys.store import ROLE_OPERATOR, ApiKeyStore
from uprof.facade import PRIVACY_CENTER, Facade, Principal, PrincipalKind
from uprof.web.state import LinkStore, Session, SessionStore

_HERE = Path(__file__).parent
_R = TypeVar("_R", bound=Response)
USER_COOKIE = "uprof_privacy"
OPERATOR_COOKIE = "uprof_console"
MAX_UPLOAD_BYTES = 20 * 1024 * 1024
#: Rows on one page of a console list; "Next page" continues with the list's cursor.
CONSOLE_PAGE_ROWS = 100
#: How a privacy-center principal is named (audit: ``privacy-center#<link id>``).

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'none'; style-src 'self'; img-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}


def fmt_time(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return "" if value is None else str(value)


def parse_time(raw: str, field: str) -> str | None:
    """A form time (``datetime-local`` or RFC 3339) as RFC 3339 UTC; empty gives None.
    A refusal names the form ``field``."""
    raw = raw.strip()
    if not raw:
        return None
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError as error:
        raise ValueError(f"{field}: not a date and time: {raw!r}") from error
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


class WebPages:
    """What every page shares: the templates, the replies and the session checks.

    One per process: the web routes are built once (``uprof.web.routes``) and serve every
    app of the process. What belongs to one app (its sign-in link store, its session
    store signing with its kernel's key) is kept on that app (``_AppStores``), so two apps
    in a process never share a link or a session.
    """

    def __init__(self) -> None:
        self.templates = Jinja2Templates(directory=str(_HERE / "templates"))
        self.templates.env.filters["when"] = fmt_time
        self.css = (_HERE / "static" / "style.css").read_text(encoding="utf-8")

    # ------------------------------------------------------------------ replies

    @staticmethod
    def runtime_of(request: Request) -> ServiceRuntime:
        runtime: ServiceRuntime = request.app.state.runtime
        return runtime

    def links(self, request: Request) -> LinkStore:
        """The sign-in link store of the app serving ``request``."""
        return _AppStores.of(request).links

    def sessions(self, request: Request) -> SessionStore:
        """The session store of the app serving ``request``, signing with its deployment's
        key (made on first use: the routes are built before the server knows its kernel)."""
        stores = _AppStores.of(request)
        if stores.sessions is None:
            with _APP_STORES_LOCK:
                if stores.sessions is None:
                    kernel = self.runtime_of(request).kernel
                    stores.sessions = SessionStore(
                        kernel.web_session_key,
                        sign_outs=kernel.web_sign_outs,
                        tenant=kernel.subjects.tenant,
                    )
        return stores.sessions

    def page(self, request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        response = self.templates.TemplateResponse(request, name, context, status_code=status)
        response.headers.update(SECURITY_HEADERS)
        return response

    def message(
        self, request: Request, status: int, title: str, text: str, **extra: Any
    ) -> HTMLResponse:
        return self.page(request, "message.html", status, title=title, text=text, **extra)

    @staticmethod
    def set_cookie(request: Request, response: Response, name: str, value: str, path: str) -> None:
        response.set_cookie(
            name,
            value,
            httponly=True,
            samesite="strict",
            path=path,
            secure=request.url.scheme == "https",
        )

    def cross_site(self, request: Request) -> HTMLResponse | None:
        """A 403 page for a sign-in form another site made the browser post (login CSRF:
        the visitor would be signed into the sender's session); None for uprof's own.

        Sign-in forms carry no session's CSRF token (there is no session yet), so the
        browser's word decides: ``Sec-Fetch-Site`` (sent by every current browser), else
        an ``Origin`` naming another host. A client that sends neither is no browser.
        """
        site = request.headers.get("sec-fetch-site")
        if site is not None:
            foreign = site not in ("same-origin", "none")
        else:
            origin = request.headers.get("origin")
            foreign = origin is not None and urlsplit(origin).netloc != request.headers.get(
                "host", ""
            )
        if not foreign:
            return None
        return self.message(
            request,
            403,
            "Form from another site",
            "This sign-in form was not sent from uprof's own page. Open the page here and "
            "sign in from it.",
        )

    def bad_csrf(self, request: Request) -> HTMLResponse:
        return self.message(
            request,
            403,
            "Form expired",
            "This form is not from your current session. Reload the page and retry.",
        )

    def kernel_error(self, request: Request, error: UprofError) -> HTMLResponse:
        status, _ = classify(error)
        return retry_later(self.message(request, status, "Request refused", str(error)), error)

    # ------------------------------------------------- privacy-center sessions

    def user_session(self, request: Request) -> Session | None:
        return self.sessions(request).get(request.cookies.get(USER_COOKIE), "user")

    def same_incarnation(self, request: Request, subject: str, incarnation: str) -> bool:
        """Whether the name still stands for the subject a link or session was issued
        for: True while it stands for none (erased: the pages say so, receipts stay
        downloadable), False once it names another subject (erased, then re-created)."""
        user = Session(kind="user", subject=subject, incarnation=incarnation)
        current = user_door(self.runtime_of(request), user).subject_pseudonym(subject)
        if current is None:
            return True
        return hmac.compare_digest(self.sessions(request).incarnation(current), incarnation)

    def issuer_stands(self, request: Request, session: Session) -> bool:
        """Whether what issued a privacy-center link (or the session it opened) still
        stands: the API key that asked for it is live (a link or session from before
        links named their key has none, and its bounded life), and the operators' policy
        still allows what issuing it needed (``Facade.privacy_link_stands``, which
        audits a refusal): a link is not worth more than its issuer's rights. While the
        policy store cannot be read, its ``PolicyStoreError`` goes up to the page (a
        refusal that keeps the session), never False (which ends it)."""
        keys: ApiKeyStore = request.app.state.api_keys
        if session.key_id and not keys.is_live(session.key_id):
            return False
        try:
            user_door(self.runtime_of(request), session).privacy_link_stands()
        except PermissionDeniedError:
            return False
        return True

    def user_reader(self, request: Request, session: Session) -> Facade:
        """The door for a page that shows the session's subject data or erases it: after
        its read or the erasure's wait (the views) it asks again whether the link stands
        (``issuer_stands``), and shows or erases nothing if it no longer does
        (``Facade._decided_again``)."""

        def still_live() -> None:
            if not self.issuer_stands(request, session):
                raise PermissionDeniedError(
                    "the sign-in link no longer stands (the key that issued it was revoked, "
                    "or the policy no longer lets operators export and erase); nothing is "
                    "shown or erased"
                )

        return user_door(self.runtime_of(request), session, still_live=still_live)

    def need_user(self, request: Request) -> Session | HTMLResponse:
        session = self.user_session(request)
        if session is not None:
            # Counted first: a page over the limit asks no store (the subject's
            # incarnation, the issuing key) before its 429.
            refused = self._counted(request, session)
            if refused is not None:
                return refused
        if session is not None and not (
            self.same_incarnation(request, session.subject, session.incarnation)
            and self.issuer_stands(request, session)
        ):
            self.sessions(request).drop(request.cookies.get(USER_COOKIE), "user")
            session = None
        if session is None:
            return self.message(
                request,
                401,
                "Sign-in needed",
                "Open the sign-in link you were given to reach your privacy center.",
            )
        return session

    def _counted(self, request: Request, session: Session) -> HTMLResponse | None:
        """Count one page of the session against ``privacy_rate_limit`` (keyed by the link
        that opened it), or a 429 page that reads and records nothing: each page showing
        the subject's data appends an audit entry (decision 0102)."""
        limiter = _AppStores.of(request).limiter(self.runtime_of(request))
        key = session.link_id or request.cookies.get(USER_COOKIE) or ""
        return self._over_limit(request, limiter, key)

    def _over_limit(
        self, request: Request, limiter: KeyRateLimiter | None, key: str
    ) -> HTMLResponse | None:
        """Count one page for ``key``: None, or the 429 page (with ``Retry-After``)."""
        if limiter is None:
            return None
        try:
            limiter.check(key)
        except RateLimitUnavailableError:
            # Fail closed: a page the deployment cannot count is not served.
            response = self.message(
                request,
                503,
                "Service unavailable",
                "This page cannot be shown right now. "
                f"Wait {RATE_LIMIT_UNAVAILABLE_RETRY_AFTER_S} s, then reload the page.",
            )
            response.headers["Retry-After"] = str(RATE_LIMIT_UNAVAILABLE_RETRY_AFTER_S)
            return response
        except RateLimitedError as refused:
            response = self.message(
                request,
                429,
                "Too many requests",
                "This session has opened too many pages in a short time. "
                f"Wait {refused.retry_after_s} s, then reload the page.",
            )
            response.headers["Retry-After"] = str(refused.retry_after_s)
            return response
        return None

    def checked_user(self, request: Request, csrf: str) -> Session | HTMLResponse:
        session = self.need_user(request)
        if isinstance(session, HTMLResponse):
            return session
        if not session.csrf_ok(csrf):
            return self.bad_csrf(request)
        return session

    # -------------------------------------------------------- console sessions

    def operator_session(self, request: Request) -> Session | None:
        return self.sessions(request).get(request.cookies.get(OPERATOR_COOKIE), "operator")

    def need_operator(self, request: Request) -> Session | Response:
        session = self.operator_session(request)
        if session is None:
            return RedirectResponse("/console/login", status_code=303)
        # The key may have been revoked since sign-in: sessions die with their key.
        if not operator_key_stands(request, session):
            self.sessions(request).drop(request.cookies.get(OPERATOR_COOKIE), "operator")
            return self.message(request, 403, "Forbidden", "Your API key is no longer valid.")
        # A console session is its key: its pages count against the key's REST allowance
        # (``rate_limit``), or a page that signs in as the key would dodge it (review of
        # 0108/0109: audit pages, each recorded, read without bound).
        refused = self.key_counted(request, session.key_id)
        return refused or session

    def key_counted(self, request: Request, key_id: str) -> HTMLResponse | None:
        """Count one page against the API key ``key_id``'s allowance (``rate_limit``, the
        one REST and MCP count against): None, or the 429 page. The console's pages, and
        its sign-in once the key is known: each sign-in is recorded (``console.signed_in``
        or ``console.sign_in_refused``), and uncounted they grew the log without bound for
        a key over its limit everywhere else (hostile callers round 5, bug BQ)."""
        limiter = getattr(request.app.state, "rate_limiter", None)
        return self._over_limit(request, limiter, key_id)

    def checked_operator(self, request: Request, csrf: str) -> Session | Response:
        session = self.need_operator(request)
        if isinstance(session, Response):
            return session
        if not session.csrf_ok(csrf):
            return self.bad_csrf(request)
        return session


def retry_later(response: _R, error: UprofError) -> _R:
    """``response``, a page refused for ``error``, with the ``Retry-After`` REST gives for
    it (a policy-store outage, review of 0173 bug MF): a temporary refusal says when."""
    wait = retry_after_s(error)
    if wait is not None:
        response.headers["Retry-After"] = str(wait)
    return response


# ---------------------------------------------------------------- downloads


_APP_STORES_LOCK = threading.Lock()


class _AppStores:
    """One app's sign-in links and sessions (``app.state.web_stores``), made on first use."""

    def __init__(self) -> None:
        self.links = LinkStore()
        self.sessions: SessionStore | None = None
        self._limiter: KeyRateLimiter | None = None
        self._limiter_made = False

    def limiter(self, runtime: ServiceRuntime) -> KeyRateLimiter | None:
        """The privacy-center sessions' rate limiter (``privacy_rate_limit``; None: off),
        made on first use from the serving kernel's settings."""
        if not self._limiter_made:
            with _APP_STORES_LOCK:
                if not self._limiter_made:
                    spec = runtime.kernel.settings.privacy_rate_limit
                    self._limiter = limiter_for(runtime.kernel, spec, PRIVACY_LINKS)
                    self._limiter_made = True
        return self._limiter

    @staticmethod
    def of(request: Request) -> _AppStores:
        state = request.app.state
        stores: _AppStores | None = getattr(state, "web_stores", None)
        if stores is None:
            with _APP_STORES_LOCK:
                stores = getattr(state, "web_stores", None)
                if stores is None:
                    stores = state.web_stores = _AppStores()
        return stores


def receipt_record(result: Any, scope: str) -> dict[str, Any]:
    body = result.receipt.get("body", {})
    return {
        "receipt": result.receipt,
        "receipt_id": str(body.get("receipt_id", "receipt")),
        "issued_at": str(body.get("issued_at", "")),
        "nonce": result.subject_nonce_hex,
        "counts": dict(result.counts),
        "scope": scope,
    }


def download(text: str, filename: str, media_type: str) -> Response:
    return PlainTextResponse(
        text,
        media_type=media_type,
        headers={
            "Content-Disposition": f'attachment; filename="{filename}"',
            "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff",
        },
    )


def verify_upload(raw: bytes, kind: str, door: Facade, filename: str) -> dict[str, Any]:
    """Verify an uploaded export or receipt; say exactly where it fails."""
    if len(raw) > MAX_UPLOAD_BYTES:
        return {
            "ok": False,
            "kind": kind,
            "filename": filename,
            "line_number": None,
            "leaf_index": None,
            "detail": "the file is too large",
            "line_text": "",
        }
    checked = door.verify_audit(raw, "receipt" if kind == "receipt" else "export")
    return {**asdict(checked), "filename": filename}


# ------------------------------------------------------------------- doors


def user_door(
    runtime: ServiceRuntime, session: Session, *, still_live: Callable[[], None] | None = None
) -> Facade:
    """The facade for a privacy-center session: a data subject, for its one subject
    (``still_live``: ``WebPages.user_reader``'s check, for pages that show its data)."""
    return Facade(
        runtime.kernel,
        Principal(
            tenant=runtime.kernel.subjects.tenant,
            app_id=PRIVACY_CENTER,
            # The link that opened the session names it on the log (a cookie signed
            # before links had ids names none).
            key_id=session.link_id or "link",
            kind=PrincipalKind.USER,
            subject=session.subject,
        ),
        still_authenticated=still_live,
    )


def key_door(
    runtime: ServiceRuntime,
    app_id: str,
    key_id: str,
    *,
    still_live: Callable[[], None] | None = None,
) -> Facade:
    """The facade for an operator API key (console sessions, link issuing)."""
    return Facade(
        runtime.kernel,
        Principal(
            tenant=runtime.kernel.subjects.tenant,
            app_id=app_id,
            key_id=key_id,
            kind=PrincipalKind.APP,
            roles=frozenset({ROLE_OPERATOR}),
        ),
        still_authenticated=still_live,
    )


def operator_key_stands(request: Request, session: Session) -> bool:
    """Whether the console session's key is live and still an operator's."""
    keys: ApiKeyStore = request.app.state.api_keys
    return any(
        k.key_id == session.key_id and not k.is_revoked and ROLE_OPERATOR in k.roles
        for k in keys.list(session.app_id)
    )


def operator_door(request: Request, session: Session) -> Facade:
    """The facade for a console session, with the console's own credential check: where
    the facade decides a long action again (``Facade._decided_again``: a residue scan
    once it has read everything) it asks whether the key still stands, as
    ``WebPages.user_reader`` does for the privacy center. The pages asked it only when
    they opened, so a key revoked during a scan still got its report (bug RM)."""

    def still_live() -> None:
        if not operator_key_stands(request, session):
            raise PermissionDeniedError(
                "the console's API key was revoked, or is no longer an operator's, while "
                "the action ran; nothing is shown"
            )

    runtime = WebPages.runtime_of(request)
    return key_door(runtime, session.app_id, session.key_id, still_live=still_live)
