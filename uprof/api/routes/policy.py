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
from typing import Annotated, Any, TypeVar

from fastapi import Query
from pydantic import AwareDatetime

from uprof.api.deps import CurrentPrincipal, Runtime
from uprof.api.errors import EdgeError
from uprof.api.routes.docs import api_router, errors
from uprof.api.scoped import AppScope, scope_with_role
from uprof.apikeys.store import ROLE_OPERATOR, Principal
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


def _operator(runtime: Any, principal: Principal) -> str:
    """Refuse a key without the operator role (audited); return the label changes are
    recorded under."""
    scope_with_role(runtime, principal.app_id, principal.roles, principal.key_id, ROLE_OPERATOR)
    return f"{principal.app_id}#{principal.key_id}"


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
    principal: CurrentPrincipal,
    runtime: Runtime,
    at: Annotated[AwareDatetime | None, Query(description="Show the policy in force then.")] = None,
) -> PolicyOut:
    """The policy in force now, or at a past time (replayed from the recorded changes)."""
    _operator(runtime, principal)
    when: datetime | None = at
    return policy_out(_guarded(lambda: _door(runtime, principal).policy_show(when)))


@router.get("/history", response_model=PolicyHistoryOut, responses=errors(403))
def policy_history(
    principal: CurrentPrincipal,
    runtime: Runtime,
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
    _operator(runtime, principal)
    page = _guarded(
        lambda: _door(runtime, principal).list_policy_history(cursor=cursor, limit=limit)
    )
    return PolicyHistoryOut(
        changes=[change_out(c) for c in page.items], next_cursor=page.next_cursor
    )


@router.post("/grant", response_model=PolicyChangeResultOut, responses=errors(403))
def grant_policy(
    body: PolicyChangeIn, principal: CurrentPrincipal, runtime: Runtime
) -> PolicyChangeResultOut:
    """Give an app a role, or add rules; rows already in force are left as they are."""
    _operator(runtime, principal)
    return result_out(_guarded(lambda: _door(runtime, principal).policy_grant(**body.model_dump())))


@router.post("/revoke", response_model=PolicyChangeResultOut, responses=errors(403))
def revoke_policy(
    body: PolicyChangeIn, principal: CurrentPrincipal, runtime: Runtime
) -> PolicyChangeResultOut:
    """Take a role back, or remove rules; every named row must be in force (else 422)."""
    _operator(runtime, principal)
    return result_out(
        _guarded(lambda: _door(runtime, principal).policy_revoke(**body.model_dump()))
    )


@router.post("/onboard", response_model=PolicyChangeResultOut, responses=errors(403))
def onboard_app(
    body: OnboardIn, principal: CurrentPrincipal, runtime: Runtime
) -> PolicyChangeResultOut:
    """Grant an app read, capture and propose of categories for one purpose, in one change.

    Issue its API key with ``uprof apps create`` (or do both at once there).
    """
    _operator(runtime, principal)
    return result_out(
        _guarded(
            lambda: _door(runtime, principal).onboard_app(
                body.app_id,
                read=body.read,
                purpose=body.purpose,
                capture=body.capture,
                propose=body.propose,
            )
        )
    )


def _door(runtime: Any, principal: Any) -> Facade:
    """The facade for the request's operator key (the policy's ``policy`` action decides)."""
    return AppScope(runtime, principal.app_id, principal.roles, key_id=principal.key_id).door
