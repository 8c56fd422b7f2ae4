"""Wire models of the policy routes (``/v1/policy``), for operator keys only.

Unlike every other request model, these name an app: ``app_id`` is the app whose
permissions change, never the caller (the caller is the operator key that authenticated,
and the change is recorded under that key's label).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

_NAMES: list[str] = Field(default_factory=list, max_length=64)


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _example(example: dict[str, Any]) -> ConfigDict:
    """A request model's config with one example body, shown in the OpenAPI document.

    Placeholders in angle brackets stand for ids a previous answer returns; everything
    else is a valid request as it stands (tests/api/test_openapi_examples.py posts them).
    """
    return ConfigDict(extra="forbid", json_schema_extra={"examples": [example]})


class _Response(BaseModel):
    model_config = ConfigDict(extra="ignore")


class PolicyChangeIn(_Request):
    """A grant or revoke: a role for an app (``app_id`` + ``role``), or rules.

    Rules: every action x category for ``purpose`` (``*`` for every purpose), to
    ``app_id`` or to ``role``, exactly one of them.
    """

    model_config = _example(
        {
            "app_id": "app:coach",
            "actions": ["read"],
            "categories": ["goal", "schedule"],
            "purpose": "personalization",
        }
    )

    app_id: str | None = Field(default=None, max_length=128)
    role: str | None = Field(default=None, max_length=70)
    actions: list[str] = _NAMES
    categories: list[str] = _NAMES
    purpose: str | None = Field(default=None, max_length=64)
    effect: str = Field(default="allow", max_length=8)


class OnboardIn(_Request):
    """Grant a new app read (and by default capture and propose) of categories for a purpose."""

    model_config = _example(
        {
            "app_id": "app:coach",
            "read": ["goal", "schedule", "preference"],
            "purpose": "personalization",
        }
    )

    app_id: str = Field(max_length=128)
    read: list[str] = Field(min_length=1, max_length=64)
    purpose: str = Field(max_length=64)
    capture: list[str] | None = Field(default=None, max_length=64)
    propose: list[str] | None = Field(default=None, max_length=64)


class PolicyRuleOut(_Response):
    subject: str
    tenant: str
    action: str
    category: str
    purpose: str
    effect: str


class RoleAssignmentOut(_Response):
    member: str
    role: str
    tenant: str


class PolicyOut(_Response):
    """The policy in force (now, or at the time asked); version 0: no policy, all denied."""

    tenant: str
    version: int
    at: datetime | None
    rules: list[PolicyRuleOut]
    assignments: list[RoleAssignmentOut]


class PolicyChangeOut(_Response):
    """One recorded change; ``row`` is the casbin row (``p, ...`` or ``g, ...``)."""

    version: int
    at: datetime
    change: str
    row: list[str]
    requested_by: str
    source: str = ""
    rows: int = 0


class PolicyChangeResultOut(_Response):
    """What a change did: the policy version after it, and each recorded change (none: no-op)."""

    version: int
    changes: list[PolicyChangeOut]


class PolicyHistoryOut(_Response):
    """A page of the policy's changes, oldest first."""

    changes: list[PolicyChangeOut]
    next_cursor: str | None = Field(
        default=None,
        description="Send it back as cursor for the next page; null on the last page.",
    )
