"""The full seed-policy matrix: every app x tenant x action x category x purpose (I3)."""

from __future__ import annotations

import itertools

import pytest

from domain.errors import PermissionDeniedError
from domain.values import CATEGORIES
from policies import ACTIONS, CasbinAuthorizer
from tests.policies.expectations import (
    ACTIONS as EXPECTED_ACTIONS,
)
from tests.policies.expectations import (
    ALL_CATEGORIES,
    APPS,
    PURPOSES,
    TENANTS,
    expected_allowed,
)


def test_expectation_table_covers_the_current_catalogue_and_actions() -> None:
    # If the catalogue or the action list grows, the hand-written table must be revisited.
    assert ALL_CATEGORIES == CATEGORIES
    assert EXPECTED_ACTIONS == ACTIONS


@pytest.mark.parametrize(("app", "tenant"), list(itertools.product(APPS, TENANTS)))
def test_seed_policy_matches_the_expectation_table(
    seeded: CasbinAuthorizer, app: str, tenant: str
) -> None:
    mismatches = []
    allowed_count = 0
    for action, category, purpose in itertools.product(ACTIONS, CATEGORIES, PURPOSES):
        expected = expected_allowed(app, tenant, action, category, purpose)
        request = {"app_id": app, "tenant": tenant, "action": action, "category": category}
        try:
            decision = seeded.authorize(**request, purpose=purpose)
            actual = True
            assert decision.allowed
            assert decision.rule[-1] == "allow"
        except PermissionDeniedError:
            actual = False
        assert seeded.is_allowed(**request, purpose=purpose) is actual
        if actual != expected:
            mismatches.append((action, category, purpose, expected, actual))
        allowed_count += actual
    assert mismatches == []
    if tenant == "acme" or app == "app:unknown":
        assert allowed_count == 0


@pytest.mark.parametrize(("app", "tenant"), list(itertools.product(APPS, TENANTS)))
def test_decisions_for_agrees_with_the_expectation_table(
    seeded: CasbinAuthorizer, app: str, tenant: str
) -> None:
    for action, purpose in itertools.product(ACTIONS, PURPOSES):
        decisions = seeded.decisions_for(
            app_id=app, tenant=tenant, action=action, purpose=purpose, categories=CATEGORIES
        )
        assert list(decisions) == list(CATEGORIES)
        for category, decision in decisions.items():
            assert decision.allowed is expected_allowed(app, tenant, action, category, purpose)


def test_denials_name_app_action_category_and_purpose(seeded: CasbinAuthorizer) -> None:
    with pytest.raises(PermissionDeniedError) as caught:
        seeded.authorize(
            app_id="app:calendar",
            tenant="default",
            action="read",
            category="diet",
            purpose="scheduling",
        )
    message = str(caught.value)
    for part in ("'app:calendar'", "read", "'diet'", "'scheduling'", "deny by default"):
        assert part in message


def test_assistants_are_denied_health_by_an_explicit_rule(seeded: CasbinAuthorizer) -> None:
    decision = seeded.decide(
        app_id="app:planner",
        tenant="default",
        action="read",
        category="health",
        purpose="personalization",
    )
    assert not decision.allowed
    assert decision.rule == ("role:assistant", "default", "read", "health", "*", "deny")
