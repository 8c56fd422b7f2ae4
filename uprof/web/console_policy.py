"""The console's policy page: the rules in force, their history, grant and revoke."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Request
from fastapi.responses import Response

from domain.errors import UprofError
from domain.values import CATEGORIES
from policies.rules import ACTIONS as POLICY_ACTIONS
from uprof.api.errors import classify
from uprof.api.routes.docs import api_router
from uprof.facade import PolicyStoreError
from uprof.web.pages import (
    CONSOLE_PAGE_ROWS,
    WebPages,
    operator_door,
    retry_later,
)
from uprof.web.state import Session


def policy_page(
    web: WebPages,
    request: Request,
    session: Session,
    status: int = 200,
    *,
    error: str = "",
    done: str = "",
    form: dict[str, str] | None = None,
) -> Response:
    runtime = web.runtime_of(request)
    tenant = runtime.kernel.subjects.tenant
    by_app: dict[str, list[Any]] = {}
    table, state, history, next_query = None, None, [], ""
    cursor = request.query_params.get("cursor") or None
    door = operator_door(request, session)
    # An unreadable store denies every check: say so, and show no rules (none is in force).
    problem = door.policy_health()
    if not problem:
        try:  # every read through the door: a key denied ``policy`` sees no rule (403)
            table = door.policy_table()
            state = door.policy_show()
            page = door.list_policy_history(
                cursor=cursor, limit=CONSOLE_PAGE_ROWS, newest_first=True
            )
            history = list(page.items)
            next_query = urlencode({"cursor": page.next_cursor}) if page.next_cursor else ""
        except PolicyStoreError as failure:
            table, state, problem = None, None, str(failure)
        except UprofError as failure:  # denied (403), a bad cursor (422)
            return web.kernel_error(request, failure)
    for row in table or ():
        by_app.setdefault(row.app, []).append(row)
    return web.page(
        request,
        "console_policy.html",
        status,
        session=session,
        tenant=tenant,
        by_app=sorted(by_app.items()),
        available=table is not None or bool(problem),
        state=state,
        history=history,
        continued=cursor is not None,
        next_query=next_query,
        problem=problem,
        error=error,
        done=done,
        form=form or {},
        actions=POLICY_ACTIONS,
        categories=CATEGORIES,
    )


def router(web: WebPages) -> APIRouter:
    """Policy page and policy changes."""
    router = api_router()

    @router.get("/console/policy", include_in_schema=False)
    def console_policy(request: Request) -> Response:
        session = web.need_operator(request)
        if isinstance(session, Response):
            return session
        return policy_page(web, request, session)

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
        session = web.checked_operator(request, csrf)
        if isinstance(session, Response):
            return session
        if verb not in ("grant", "revoke"):
            return web.message(request, 404, "Not found", "No such policy change.")
        door = operator_door(request, session)
        form = {"app_id": app_id, "role": role, "purpose": purpose, "effect": effect}
        change = door.policy_grant if verb == "grant" else door.policy_revoke
        try:
            result = change(
                app_id=app_id.strip() or None,
                role=role.strip() or None,
                actions=[a for a in actions or () if a],
                categories=[c for c in categories or () if c],
                purpose=purpose.strip() or None,
                effect=effect.strip() or "allow",
            )
        except UprofError as failure:
            status, _ = classify(failure)
            if status == 403:
                # Refused ``policy``, the key may not read the rules either: drawing the
                # page again asked the door for them, refused and audited a second time,
                # two entries for one request (round 8, bug LR).
                return web.kernel_error(request, failure)
            shown = policy_page(web, request, session, status, error=str(failure), form=form)
            return retry_later(shown, failure)
        done = (
            f"{verb}: {len(result.changes)} change(s) recorded, policy version {result.version}"
            if result.changes
            else f"nothing to {verb}: the policy already says so"
        )
        return policy_page(web, request, session, done=done)

    return router
