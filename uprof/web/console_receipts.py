"""The console's erasure receipts and the residue scan auditors run against them."""

from __future__ import annotations

import itertools
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import Response

from uprof.web.pages import (
    MAX_AUDIT_ROWS,
    WebPages,
    operator_door,
)


def router(web: WebPages) -> APIRouter:
    """Receipts list and residue scan."""
    router = APIRouter()

    @router.get("/console/receipts", include_in_schema=False)
    def console_receipts(request: Request) -> Response:
        session = web.need_operator(request)
        if isinstance(session, Response):
            return session
        from audit.receipts import RECEIPT_ACTION

        door = operator_door(web.runtime_of(request), session)
        entries = door.audit_entries(action=RECEIPT_ACTION)
        rows = [
            (e.leaf_index, e.recorded_at, e.entry)
            for e in itertools.islice(entries, MAX_AUDIT_ROWS)
        ]
        return web.page(
            request, "console_receipts.html", session=session, rows=rows, report=None, terms=""
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
        from audit.receipts import RECEIPT_ACTION

        wanted = [t.strip() for t in terms.splitlines() if t.strip()]
        door = operator_door(web.runtime_of(request), session)
        if not wanted:
            report = None
            error = "Give at least one term, one per line."
        else:
            report, error = door.residue_scan(wanted), ""
        entries = door.audit_entries(action=RECEIPT_ACTION)
        rows = [
            (e.leaf_index, e.recorded_at, e.entry)
            for e in itertools.islice(entries, MAX_AUDIT_ROWS)
        ]
        return web.page(
            request,
            "console_receipts.html",
            session=session,
            rows=rows,
            report=report,
            terms=terms,
            error=error,
        )

    return router
