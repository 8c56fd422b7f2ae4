"""The privacy center's home: the subject's profile in three layers, consents, export.

Every handler takes the subject from the session, never from the request.
"""

from __future__ import annotations

import json
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from domain.errors import UprofError
from domain.values import CATEGORIES
from policies.rules import app_id_problem, purpose_problem
from uprof.api.errors import classify
from uprof.api.routes.docs import api_router
from uprof.api.runtime import ServiceRuntime
from uprof.facade import Facade
from uprof.web.pages import (
    WebPages,
    download,
    receipt_record,
    retry_later,
    user_door,
)
from uprof.web.state import Session

#: Memories shown per page: a subject's memories grow without bound, its attributes and
#: intents do not (one per key or goal), so only the memories are paged.
MEMORIES_PER_PAGE = 50


def profile_context(
    runtime: ServiceRuntime, session: Session, door: Facade, memory_cursor: str | None = None
) -> dict[str, Any]:
    with runtime.pipeline():  # one read, recorded before the page is (subject.read)
        shown = door.profile_page(
            session.subject, memory_cursor=memory_cursor, memories=MEMORIES_PER_PAGE
        )
    view, memories, captures = shown.view, shown.memories, shown.captures
    reads: dict[str, list[dict[str, Any]]] = {}
    for item_id, app_id, purpose, n, at in shown.reads:
        reads.setdefault(item_id, []).append(
            {"app_id": app_id, "purpose": purpose, "reads": n, "last_read_at": at}
        )
    for entries in reads.values():
        entries.sort(key=lambda r: r["last_read_at"], reverse=True)

    def item(layer: str, row: Any, label: str, detail: str) -> dict[str, Any]:
        return {
            "layer": layer,
            "id": row.item_id,
            "label": label,
            "detail": detail,
            "category": row.category,
            "provenance": row.provenance,
            "evidence": [captures[e] for e in row.evidence if e in captures],
            "reads": reads.get(row.item_id, []),
        }

    # (title, blurb, items, link to the next page of that layer or "")
    more = f"/privacy?{urlencode({'memories': memories.next_cursor})}#memories"
    layers = [
        (
            "Attributes",
            "What you are, as stated or inferred",
            [
                item(
                    "attribute",
                    a,
                    f"{a.key}: {a.value}",
                    f"{a.status}, confidence {a.confidence:.2f}",
                )
                for a in view.attributes
            ],
            "",
        ),
        (
            "Memories",
            "Things that happened or were said",
            [
                item("memory", m, m.text, f"{m.kind}{', archived' if m.archived else ''}")
                for m in memories.items
            ],
            more if memories.next_cursor else "",
        ),
        (
            "Intents",
            "What you want to do",
            [
                item("intent", i, i.description, f"{i.status}, confidence {i.confidence:.2f}")
                for i in view.intents
            ],
            "",
        ),
    ]
    consents = sorted(view.consents, key=lambda c: (c.withdrawn_at is not None, c.app_id))
    return {
        "layers": layers,
        "consents": consents,
        "erasures_unfinished": shown.erasures_unfinished,
        "memories_paged": memory_cursor is not None,
    }


def router(web: WebPages) -> APIRouter:
    """The profile page, consent changes and the subject's export."""
    router = api_router()

    @router.get("/privacy", include_in_schema=False)
    def privacy_home(request: Request) -> Response:
        session = web.need_user(request)
        if isinstance(session, HTMLResponse):
            return session
        runtime = web.runtime_of(request)
        try:
            context = profile_context(
                runtime,
                session,
                web.user_reader(request, session),
                request.query_params.get("memories"),
            )
        except UprofError as error:
            status, _ = classify(error)
            if session.receipts:  # erased: what is left is the receipts
                return RedirectResponse("/privacy/receipts", status_code=303)
            shown = web.message(request, status, "Profile not available", str(error))
            return retry_later(shown, error)
        return web.page(
            request,
            "privacy.html",
            session=session,
            categories=("*", *CATEGORIES),
            notice=request.query_params.get("notice", ""),
            **context,
        )

    def own_consent(runtime: ServiceRuntime, session: Session, consent_id: str) -> bool:
        # A consent in force is found in the subject's stream, whatever the pipeline's
        # lag: the user's withdrawal must not wait for the views (decision 0064). Only
        # another id (withdrawn already, mistyped) is looked up in the views.
        door = user_door(runtime, session)
        if any(c.consent_id == consent_id for c in door.consents_in_force(session.subject)):
            return True
        with runtime.pipeline():
            consents = door.consents(session.subject)
        return any(c.consent_id == consent_id for c in consents)

    # Also the "Finish erasure" button of a consent withdrawn with erase whose erasure
    # stopped half-way: the same withdrawal with erase asked again, which the kernel
    # finishes (``Uprof.withdraw_consent``, bug RE), for the owner only, decided again.
    @router.post("/privacy/consents/withdraw", include_in_schema=False)
    def privacy_withdraw(
        request: Request,
        csrf: Annotated[str, Form()] = "",
        consent_id: Annotated[str, Form()] = "",
        erase: Annotated[str, Form()] = "",
    ) -> Response:
        session = web.checked_user(request, csrf)
        if isinstance(session, HTMLResponse):
            return session
        runtime = web.runtime_of(request)
        subject = session.subject
        try:
            if not own_consent(runtime, session, consent_id):
                return web.message(
                    request, 404, "No such consent", "You gave no consent with that id."
                )
            # With erase the withdrawal reads the consents through the views (a wait):
            # the door asks again whether the link's issuer stands before it erases.
            door = web.user_reader(request, session)
            result = runtime.call_waiting(
                lambda: door.withdraw_consent(subject, consent_id, erase=bool(erase))
            )
            runtime.wake()
        except UprofError as error:
            return web.kernel_error(request, error)
        if result is None:
            return RedirectResponse("/privacy?notice=withdrawn", status_code=303)
        session.receipts.append(receipt_record(result, "consent withdrawal"))
        return RedirectResponse("/privacy?notice=erased", status_code=303)

    @router.post("/privacy/consents/grant", include_in_schema=False)
    def privacy_grant(
        request: Request,
        csrf: Annotated[str, Form()] = "",
        app_id: Annotated[str, Form()] = "",
        category: Annotated[str, Form()] = "",
        purpose: Annotated[str, Form()] = "",
    ) -> Response:
        session = web.checked_user(request, csrf)
        if isinstance(session, HTMLResponse):
            return session
        app_id, category, purpose = app_id.strip(), category.strip(), purpose.strip()
        # Checked here with the rules the door applies, naming the form's own fields: the
        # door's refusal would name the REST body's (``purposes``), which this form has not.
        problems = {
            "app_id": app_id_problem(app_id),
            "category": None
            if category in ("*", *CATEGORIES)
            else f"unknown category {category!r}",
            "purpose": purpose_problem(purpose) if purpose else "a purpose is needed",
        }
        problem = next((f"{name}: {p}" for name, p in problems.items() if p), "")
        if problem:
            return web.message(request, 422, "Consent not recorded", problem)
        runtime = web.runtime_of(request)
        try:
            user_door(runtime, session).grant_consent(
                session.subject, app_id=app_id, categories=[category], purposes=[purpose]
            )
            runtime.wake()
        except UprofError as error:
            return web.kernel_error(request, error)
        return RedirectResponse("/privacy?notice=granted", status_code=303)

    @router.get("/privacy/export.json", include_in_schema=False)
    def privacy_export(request: Request) -> Response:
        session = web.need_user(request)
        if isinstance(session, HTMLResponse):
            return session
        runtime = web.runtime_of(request)
        try:
            with runtime.pipeline():
                export = web.user_reader(request, session).export_subject(session.subject)
        except UprofError as error:
            return web.kernel_error(request, error)
        return download(
            json.dumps(export, indent=2, sort_keys=True, default=str),
            "my-profile-export.json",
            "application/json",
        )

    return router
