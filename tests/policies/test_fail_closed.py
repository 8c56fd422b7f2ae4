"""Malformed requests are denied with a clear reason; nothing but PermissionDeniedError escapes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from domain.errors import PermissionDeniedError
from policies import CasbinAuthorizer, PolicyDeniedError
from tests.policies.expectations import (
    ACTIONS,
    ALL_CATEGORIES,
    APPS,
    PURPOSES,
    TENANTS,
    expected_allowed,
)

GOOD = {
    "app_id": "app:planner",
    "tenant": "default",
    "action": "read",
    "category": "diet",
    "purpose": "personalization",
}
SECRET = "alice@example.com"


@pytest.mark.parametrize(
    ("field", "value", "complaint"),
    [
        ("app_id", "", "app id is empty"),
        # Casbin alone would allow this: a role name matches its own rules.
        ("app_id", "role:assistant", "names a role"),
        ("app_id", "app:planner\n", "app id is malformed"),
        ("app_id", f"app:planner,{SECRET} x", "app id is malformed"),
        ("tenant", "", "tenant is malformed"),
        ("tenant", "default\n", "tenant is malformed"),
        ("tenant", "*", "tenant is malformed"),
        ("action", "READ", "action is unknown"),
        ("action", "delete", "action is unknown"),
        ("category", "any", "not in the catalogue"),
        ("category", "Diet", "not in the catalogue"),
        ("category", SECRET, "not in the catalogue"),
        ("purpose", "personalization\n", "purpose is malformed"),
        ("purpose", "personalization,scheduling", "purpose is malformed"),
        ("purpose", "*", "purpose is malformed"),
        ("purpose", f"remind {SECRET}", "purpose is malformed"),
        ("purpose", "", "purpose is malformed"),
        ("purpose", None, "purpose is malformed"),
        ("category", 7, "not in the catalogue"),
    ],
)
def test_malformed_requests_are_denied_with_a_reason_that_never_repeats_the_value(
    seeded: CasbinAuthorizer, field: str, value: Any, complaint: str
) -> None:
    request = {**GOOD, field: value}
    with pytest.raises(PolicyDeniedError) as caught:
        seeded.authorize(**request)
    message = str(caught.value)
    assert complaint in message
    assert SECRET not in message
    assert "<refused>" in message
    assert caught.value.decision.rule == ()
    assert not seeded.is_allowed(**request)
    assert not seeded.decide(**request).allowed


def test_the_good_request_used_above_is_allowed(seeded: CasbinAuthorizer) -> None:
    # Guards the table above: each case must fail because of its one bad field.
    assert seeded.authorize(**GOOD).allowed


def _field(known: tuple[str, ...]) -> st.SearchStrategy[Any]:
    near_misses = st.sampled_from(known).map(lambda v: v + "\n") | st.sampled_from(known).map(
        str.upper
    )
    return st.one_of(st.sampled_from(known), near_misses, st.text(max_size=40), st.none())


REQUESTS = st.fixed_dictionaries(
    {
        "app_id": _field((*APPS, "role:assistant", "role:dpo")),
        "tenant": _field(TENANTS),
        "action": _field(ACTIONS),
        "category": _field((*ALL_CATEGORIES, "any")),
        "purpose": _field((*PURPOSES, "*")),
    }
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=REQUESTS)
def test_random_requests_raise_only_permission_denied_and_allow_only_what_the_table_allows(
    seeded: CasbinAuthorizer, request: dict[str, Any]
) -> None:
    try:
        decision = seeded.authorize(**request)
    except PermissionDeniedError:
        assert not seeded.is_allowed(**request)
        return
    assert decision.allowed
    assert request["app_id"] in APPS and request["app_id"] != "app:unknown"
    assert expected_allowed(
        request["app_id"],
        request["tenant"],
        request["action"],
        request["category"],
        request["purpose"],
    )


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    app_id=st.text(max_size=30),
    categories=st.lists(st.sampled_from(ALL_CATEGORIES) | st.text(max_size=12), max_size=20),
)
def test_unknown_apps_are_allowed_nothing(
    seeded: CasbinAuthorizer, app_id: str, categories: list[str]
) -> None:
    if app_id in APPS and app_id != "app:unknown":
        return
    for purpose in PURPOSES:
        for action in ACTIONS:
            decisions = seeded.decisions_for(
                app_id=app_id,
                tenant="default",
                action=action,
                purpose=purpose,
                categories=categories,
            )
            assert not any(decision.allowed for decision in decisions.values())
