"""The console's erasure receipts and the residue scan auditors run against them."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Request
from fastapi.responses import Response

from domain.errors import InvalidInputError, UprofError
from uprof.api.routes.docs import api_router
from uprof.facade import Facade
from uprof.web.pages import CONSOLE_PAGE_ROWS, WebPages, operator_door


def receipts_page(door: Facade, cursor: str | None) -> dict[str, Any]:
    """One page of receipts for the template: rows, and the links to the next and first."""
    page = door.list_receipts(cursor=cursor, limit=CONSOLE_PAGE_ROWS)
    return {
        "rows": [(e.leaf_index, e.recorded_at, e.entry) for e in page.items],
        "continued": cursor is not None,
        "next_query": urlencode({"cursor": page.next_cursor}) if page.next_cursor else "",
    }


def router(web: WebPages) -> APIRouter:
    """Receipts list and residue scan."""
    router = api_router()

    @router.get("/console/receipts", include_in_schema=False)
    def console_receipts(request: Request) -> Response:
        session = web.need_operator(request)
        if isinstance(session, Response):
            return session
        door = operator_door(request, session)
        try:
            listing = receipts_page(door, request.query_params.get("cursor") or None)
        except UprofError as error:
            return web.kernel_error(request, error)
        return web.page(
            request, "console_receipts.html", session=session, report=None, terms="", **listing
        )

    @router.post("/console/residue", include_in_schema=False)
    def console_residue(
        request: Request,
        csrf: Annotated[str, Form()] = "",
        terms: Annotated[str, Form()] = "",
    ) -> Response:
        session = web.checked_operator(request, csrf)
        if isinstance(session, Response):
            return session
        wanted = [t.strip() for t in terms.splitlines() if t.strip()]
        door = operator_door(request, session)
        report, error, status = None, "", 200
        if not wanted:
            error = "Give at least one term, one per line."
        else:
            try:
                report = door.residue_scan(wanted)
            except InvalidInputError as problem:  # too many terms: the form keeps them
                error, status = str(problem), 422
        return web.page(
            request,
            "console_receipts.html",
            status,
            session=session,
            report=report,
            terms=terms,
            error=error,
            **receipts_page(door, None),
        )

    return router
