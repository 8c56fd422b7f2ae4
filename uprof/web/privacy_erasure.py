"""Erasure from the privacy center (one item or everything) and the receipts it gives."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from domain.errors import ItemNotFoundError, UprofError
from uprof.api.routes.docs import api_router
from uprof.web.pages import (
    WebPages,
    download,
    receipt_record,
)


def router(web: WebPages) -> APIRouter:
    """Erasure confirmation, erasure, and the session's receipts."""
    router = api_router()

    @router.get("/privacy/erase", include_in_schema=False)
    def privacy_erase_confirm(request: Request, item_id: str = "") -> Response:
        session = web.need_user(request)
        if isinstance(session, HTMLResponse):
            return session
        target = None
        if item_id:
            # Looked up by id, not in the profile page: the item may be on any page of memories.
            runtime = web.runtime_of(request)
            try:
                with runtime.pipeline():
                    found = web.user_reader(request, session).evidence(session.subject, item_id)
            except ItemNotFoundError:
                return web.message(request, 404, "No such item", "Your profile has no such item.")
            except UprofError as error:
                return web.kernel_error(request, error)
            target = {"id": found.item_id, "layer": found.layer, "label": found.summary}
        return web.page(request, "privacy_erase.html", session=session, target=target)

    @router.post("/privacy/erase", include_in_schema=False)
    def privacy_erase(
        request: Request,
        csrf: Annotated[str, Form()] = "",
        item_id: Annotated[str, Form()] = "",
        with_evidence: Annotated[str, Form()] = "",
        confirm: Annotated[str, Form()] = "",
    ) -> Response:
        session = web.checked_user(request, csrf)
        if isinstance(session, HTMLResponse):
            return session
        if confirm != "yes":
            return web.message(request, 400, "Not confirmed", "Tick the confirmation box to erase.")
        runtime = web.runtime_of(request)
        # The door that asks the link again (its issuing key, the operators' policy) once
        # the erasure has waited, before it writes: erasure cannot be undone (bug NI).
        door = web.user_reader(request, session)
        subject = session.subject
        try:
            if item_id:
                result = runtime.call_waiting(
                    lambda: door.erase_item(subject, item_id, with_evidence=bool(with_evidence))
                )
                scope = "one item"
            else:
                result = runtime.call_waiting(lambda: door.erase_subject(subject))
                scope = "everything"
        except UprofError as error:
            return web.kernel_error(request, error)
        session.receipts.append(receipt_record(result, scope))
        return RedirectResponse("/privacy/receipts", status_code=303)

    @router.get("/privacy/receipts", include_in_schema=False)
    def privacy_receipts(request: Request) -> Response:
        session = web.need_user(request)
        if isinstance(session, HTMLResponse):
            return session
        return web.page(
            request,
            "privacy_receipts.html",
            session=session,
            receipts=list(enumerate(session.receipts)),
        )

    @router.get("/privacy/receipts/{number}/receipt.json", include_in_schema=False)
    def privacy_receipt_file(request: Request, number: int) -> Response:
        session = web.need_user(request)
        if isinstance(session, HTMLResponse):
            return session
        if not 0 <= number < len(session.receipts):
            return web.message(request, 404, "No such receipt", "No receipt with that number.")
        record = session.receipts[number]
        return download(
            json.dumps(record["receipt"], indent=2, sort_keys=True),
            f"erasure-receipt-{record['receipt_id']}.json",
            "application/json",
        )

    return router
