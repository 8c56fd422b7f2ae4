"""The authorization policy, for operator keys: show it (now or at a past time), its
history, and grant, revoke or onboard an app.

Every change is an event in the policy store and a ``policy.changed`` audit entry naming
the operator key that asked (``<app id>#<key id>``). Bad input is a 422 whose
``error.fields`` names the field; nothing is changed. An unreadable policy store is a 503
(and, meanwhile, every policy check denies).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from typing import Annotated, TypeVar

from fastapi import Query
from pydantic import AwareDatetime

from uprof.api.deps import Scope
from uprof.api.errors import EdgeError
from uprof.api.routes.docs import api_router, errors
from uprof.api.scoped import AppScope
from uprof.apikeys.store import ROLE_OPERATOR
from uprof.facade import (
    Facade,
    PolicyChange,
    PolicyChangeResult,
    PolicyInputError,
    PolicyState,
)
from uprof.schemas.api import DEFAULT_PAGE_LIMIT, MAX_CURSOR_CHARS, MAX_PAGE_LIMIT, FieldProblem
from uprof.schemas.policy import (
    OnboardIn,
    PolicyChangeIn,
    PolicyChangeOut,
    PolicyChangeResultOut,
    PolicyHistoryOut,
    PolicyOut,
    PolicyRuleOut,
    RoleAssignmentOut,
)

router = api_router(prefix="/v1/policy", tags=["policy"])
T = TypeVar("T")


def _door(scope: AppScope) -> Facade:
    """The facade for the request's operator key, once a key without the operator role
    is refused (audited). The policy's ``policy`` action decides; the door carries the
    key's check (``Scope``), which a change asks again with the policy once it has its
    turn to be written (``PolicyService._apply``): a key revoked while the change waited
    writes nothing (bug TU)."""
    scope.require_role(ROLE_OPERATOR)
    return scope.door


def _guarded(operation: Callable[[], T]) -> T:
    try:
        return operation()
    except PolicyInputError as error:
        raise EdgeError(
            422,
            "invalid_policy_change",
            str(error),
            hint=error.hint,
            fields=[FieldProblem(field=error.field, message=error.problem)],
        ) from None


def policy_out(state: PolicyState) -> PolicyOut:
    return PolicyOut(
        tenant=state.tenant,
        version=state.version,
        at=state.at,
        rules=[PolicyRuleOut.model_validate(asdict(r)) for r in state.rules],
        assignments=[RoleAssignmentOut.model_validate(asdict(a)) for a in state.assignments],
    )


def change_out(change: PolicyChange) -> PolicyChangeOut:
    return PolicyChangeOut.model_validate({**asdict(change), "row": list(change.row)})


def result_out(result: PolicyChangeResult) -> PolicyChangeResultOut:
    return PolicyChangeResultOut(
        version=result.version, changes=[change_out(c) for c in result.changes]
    )


@router.get("", response_model=PolicyOut, responses=errors(403))
def show_policy(
    scope: Scope,
    at: Annotated[AwareDatetime | None, Query(description="Show the policy in force then.")] = None,
) -> PolicyOut:
    """The policy in force now, or at a past time (replayed from the recorded changes)."""
    when: datetime | None = at
    return policy_out(_guarded(lambda: _door(scope).policy_show(when)))


@router.get("/history", response_model=PolicyHistoryOut, responses=errors(403))
def policy_history(
    scope: Scope,
    cursor: Annotated[
        str | None,
        Query(
            max_length=MAX_CURSOR_CHARS,
            description="The next_cursor of the previous page; leave it out for the first.",
        ),
    ] = None,
    limit: Annotated[
        int, Query(ge=1, le=MAX_PAGE_LIMIT, description="Most changes on this page.")
    ] = DEFAULT_PAGE_LIMIT,
) -> PolicyHistoryOut:
    """The policy's changes, oldest first, a page at a time: version, time, change, row, who."""
    page = _guarded(lambda: _door(scope).list_policy_history(cursor=cursor, limit=limit))
    return PolicyHistoryOut(
        changes=[change_out(c) for c in page.items], next_cursor=page.next_cursor
    )


@router.post("/grant", response_model=PolicyChangeResultOut, responses=errors(403))
def grant_policy(body: PolicyChangeIn, scope: Scope) -> PolicyChangeResultOut:
    """Give an app a role, or add rules; rows already in force are left as they are."""
    return result_out(_guarded(lambda: _door(scope).policy_grant(**body.model_dump())))


@router.post("/revoke", response_model=PolicyChangeResultOut, responses=errors(403))
def revoke_policy(body: PolicyChangeIn, scope: Scope) -> PolicyChangeResultOut:
    """Take a role back, or remove rules; every named row must be in force (else 422)."""
    return result_out(_guarded(lambda: _door(scope).policy_revoke(**body.model_dump())))


@router.post("/onboard", response_model=PolicyChangeResultOut, responses=errors(403))
def onboard_app(body: OnboardIn, scope: Scope) -> PolicyChangeResultOut:
    """Grant an app read, capture and propose of categories for one purpose, in one change.

    Issue its API key with ``uprof apps create`` (or do both at once there).
    """
    return result_out(
        _guarded(
            lambda: _door(scope).onboard_app(
                body.app_id,
                read=body.read,
                purpose=body.purpose,
                capture=body.capture,
                propose=body.propose,
            )
        )
    )
