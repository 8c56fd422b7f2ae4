"""The console's audit trail: search, export, the public key, offline verification."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Request, UploadFile
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from domain.errors import UprofError
from uprof.api.deps import while_live
from uprof.api.errors import classify
from uprof.api.routes.docs import api_router
from uprof.apikeys.store import ApiKeyStore
from uprof.facade import Facade
from uprof.web.pages import (
    CONSOLE_PAGE_ROWS,
    MAX_UPLOAD_BYTES,
    SECURITY_HEADERS,
    WebPages,
    download,
    operator_door,
    parse_time,
    verify_upload,
)


def audit_filter(request: Request, door: Facade) -> tuple[dict[str, str], dict[str, Any]]:
    """The search form's values and the matching ``AuditLog.entries`` arguments."""
    q = request.query_params
    form = {
        name: q.get(name, "").strip() for name in ("subject", "app", "action", "since", "until")
    }
    subject = form["subject"]
    subject_ref = door.audit_subject_ref(subject) if subject else None
    args = {
        "subject_ref": subject_ref,
        "app_id": form["app"] or None,
        "action": form["action"] or None,
        "since": parse_time(form["since"], "since"),
        "until": parse_time(form["until"], "until"),
    }
    return form, args


def router(web: WebPages) -> APIRouter:
    """Audit search, export, public key and verification pages."""
    router = api_router()

    @router.get("/console", include_in_schema=False)
    def console_audit(request: Request) -> Response:
        session = web.need_operator(request)
        if isinstance(session, Response):
            return session
        door = operator_door(request, session)
        rows: list[Any] = []
        next_cursor = None
        error = ""
        status = 200
        searched = bool(request.query_params)
        cursor = request.query_params.get("cursor") or None
        try:
            form, args = audit_filter(request, door)
            page = door.list_audit_entries(  # reads served before it are in it
                subject=form["subject"] or None,
                app_id=args["app_id"],
                action=args["action"],
                since=args["since"],
                until=args["until"],
                cursor=cursor,
                limit=CONSOLE_PAGE_ROWS,
            )
            rows, next_cursor = list(page.items), page.next_cursor
        except (UprofError, ValueError) as problem:
            form = {
                k: request.query_params.get(k, "")
                for k in ("subject", "app", "action", "since", "until")
            }
            error = str(problem)
            # A refused search says so, with the status REST would give (bad input 422).
            status = classify(problem)[0] if isinstance(problem, UprofError) else 422
            args = {}
        shown = [(r.leaf_index, r.entry) for r in rows]
        filters = {k: v for k, v in form.items() if v}
        return web.page(
            request,
            "console_audit.html",
            status,
            session=session,
            form=form,
            rows=shown,
            continued=cursor is not None,
            next_query=urlencode({**filters, "cursor": next_cursor}) if next_cursor else "",
            first_query=urlencode(filters),
            error=error,
            searched=searched,
            query=urlencode(filters),
            subject_ref=args.get("subject_ref") or "",
        )

    @router.get("/console/audit/export", include_in_schema=False)
    def console_export(request: Request, format: str = "jsonl") -> Response:
        session = web.need_operator(request)
        if isinstance(session, Response):
            return session
        door = operator_door(request, session)
        try:
            form, args = audit_filter(request, door)
            stream = door.stream_audit(
                fmt="csv" if format == "csv" else "jsonl",
                subject=form["subject"] or None,
                app_id=args["app_id"],
                action=args["action"],
                since=args["since"],
                until=args["until"],
            )
        except ValueError as problem:  # a time the form cannot read
            return web.message(request, 422, "Export refused", str(problem))
        except UprofError as problem:
            # With the status REST gives (a policy refusal 403, not a malformed search's
            # 422), as every other console page (round 8, bug LP).
            return web.kernel_error(request, problem)
        # The session's key is checked again as the trail streams (as the REST export's).
        keys: ApiKeyStore = request.app.state.api_keys
        records = while_live(stream.records, lambda: keys.is_live(session.key_id))
        response = StreamingResponse(records, media_type=stream.media_type)
        response.headers["Content-Disposition"] = f'attachment; filename="{stream.filename}"'
        response.headers.update(SECURITY_HEADERS)
        return response

    @router.get("/console/public-key.pem", include_in_schema=False)
    def console_public_key(request: Request) -> Response:
        session = web.need_operator(request)
        if isinstance(session, Response):
            return session
        pem = operator_door(request, session).audit_public_key()["public_key_pem"]
        return download(pem, "audit-public-key.pem", "application/x-pem-file")

    @router.get("/console/verify", include_in_schema=False)
    def console_verify_form(request: Request) -> Response:
        session = web.need_operator(request)
        if isinstance(session, Response):
            return session
        return web.page(
            request,
            "console_verify.html",
            session=session,
            result=None,
            origin=operator_door(request, session).audit_public_key()["origin"],
        )

    @router.post("/console/verify", include_in_schema=False)
    async def consoleverify_upload(
        request: Request,
        upload: UploadFile,
        csrf: Annotated[str, Form()] = "",
        kind: Annotated[str, Form()] = "export",
    ) -> Response:
        # Reading the upload is I/O, for the loop; checking it is CPU work over up to
        # MAX_UPLOAD_BYTES and reads the stores, so it runs in the thread pool, as every
        # plain route does: on the loop it held up every other caller's request meanwhile.
        raw = await upload.read(MAX_UPLOAD_BYTES + 1)
        return await run_in_threadpool(
            checked_upload, request, csrf, kind, raw, upload.filename or "upload"
        )

    def checked_upload(request: Request, csrf: str, kind: str, raw: bytes, name: str) -> Response:
        session = web.checked_operator(request, csrf)
        if isinstance(session, Response):
            return session
        door = operator_door(request, session)
        result = verify_upload(raw, kind, door, name)
        status = 200 if result["ok"] else 422
        return web.page(
            request,
            "console_verify.html",
            status,
            session=session,
            result=result,
            origin=door.audit_public_key()["origin"],
        )

    return router
