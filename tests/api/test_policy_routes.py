"""The policy over REST (``/v1/policy``) and on the console's policy page, both backends."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.conftest import PLANNER, Apps, LiveServer, bearer, grant, interaction
from tests.conftest import Backend
from tests.policies.test_policy_store import _rename_policy_table
from tests.web.conftest import csrf_of
from uprof.kernel import Uprof
from uprof.settings import Settings


def key_id(token: str) -> str:
    return token.split("_")[1]


def history(http: httpx.Client, key: str) -> list[dict[str, Any]]:
    response = http.get("/v1/policy/history", headers=bearer(key))
    assert response.status_code == 200, response.text
    return list(response.json()["changes"])


def test_policy_routes_need_an_operator_key(http: httpx.Client, apps: Apps) -> None:
    assert http.get("/v1/policy").status_code == 401
    for method, path in (
        ("GET", "/v1/policy"),
        ("GET", "/v1/policy/history"),
        ("POST", "/v1/policy/grant"),
        ("POST", "/v1/policy/revoke"),
        ("POST", "/v1/policy/onboard"),
    ):
        body = {"app_id": PLANNER, "role": "role:dpo"} if method == "POST" else None
        if path.endswith("onboard"):
            body = {"app_id": "app:x", "read": ["diet"], "purpose": "personalization"}
        response = http.request(method, path, headers=bearer(apps.planner), json=body)
        assert response.status_code == 403, (path, response.text)
        assert response.json()["error"]["code"] == "role_required"
    assert len(history(http, apps.planner_operator)) == 1  # nothing but the seed


def test_an_operator_changes_the_policy_and_each_change_names_the_key(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    operator = apps.planner_operator
    granted = http.post(
        "/v1/policy/grant",
        headers=bearer(operator),
        json={"app_id": "app:calendar", "role": "role:assistant"},
    )
    assert granted.status_code == 200, granted.text
    (change,) = granted.json()["changes"]
    assert change["change"] == "role.assigned"
    assert change["requested_by"] == f"{PLANNER}#{key_id(operator)}"
    shown = http.get("/v1/policy", headers=bearer(operator)).json()
    assert shown["version"] == granted.json()["version"] == 2
    assert {"member": "app:calendar", "role": "role:assistant", "tenant": "default"} in (
        shown["assignments"]
    )
    revoked = http.post(
        "/v1/policy/revoke",
        headers=bearer(operator),
        json={"app_id": "app:calendar", "role": "role:assistant"},
    )
    assert revoked.status_code == 200 and revoked.json()["version"] == 3
    seeded_at = history(http, operator)[0]["at"]
    past = http.get("/v1/policy", headers=bearer(operator), params={"at": seeded_at}).json()
    assert past["version"] == 1
    entries = [e.entry for e in kernel.audit_log.entries(action="policy.changed")]
    assert [e["change"] for e in entries] == ["seeded", "role.assigned", "role.revoked"]
    assert entries[-1]["requested_by"] == f"{PLANNER}#{key_id(operator)}"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (
            "/v1/policy/grant",
            {
                "app_id": "app:ghost",
                "actions": ["read"],
                "categories": ["diet"],
                "purpose": "personalization",
            },
            "app_id",
        ),
        ("/v1/policy/grant", {"app_id": PLANNER, "role": "role:ghost"}, "role"),
        (
            "/v1/policy/grant",
            {
                "app_id": PLANNER,
                "actions": ["read"],
                "categories": ["diet"],
                "purpose": "personalization",
                "effect": "perhaps",
            },
            "effect",
        ),
        (
            "/v1/policy/grant",
            {
                "app_id": PLANNER,
                "actions": ["fly"],
                "categories": ["diet"],
                "purpose": "personalization",
            },
            "actions",
        ),
        (
            "/v1/policy/grant",
            {
                "app_id": PLANNER,
                "actions": ["read"],
                "categories": ["dreams"],
                "purpose": "personalization",
            },
            "categories",
        ),
        ("/v1/policy/revoke", {"app_id": PLANNER, "role": "role:dpo"}, "role"),
        (
            "/v1/policy/onboard",
            {"app_id": "app:x", "read": ["diet"], "purpose": "no way"},
            "purpose",
        ),
        ("/v1/policy/grant", {"app_id": PLANNER, "role": "role:dpo", "tenant": "other"}, "tenant"),
    ],
)
def test_bad_policy_input_is_a_422_naming_the_field_and_changes_nothing(
    http: httpx.Client, apps: Apps, path: str, body: dict[str, Any], field: str
) -> None:
    before = history(http, apps.planner_operator)
    response = http.post(path, headers=bearer(apps.planner_operator), json=body)
    assert response.status_code == 422, response.text
    assert field in {f["field"] for f in response.json()["error"]["fields"]}
    assert history(http, apps.planner_operator) == before


def test_an_app_onboarded_over_rest_is_served_its_categories(
    http: httpx.Client, apps: Apps, keys: Any
) -> None:
    new_key = keys.create("app:diary").token
    onboarded = http.post(
        "/v1/policy/onboard",
        headers=bearer(apps.planner_operator),
        json={"app_id": "app:diary", "read": ["location"], "purpose": "personalization"},
    )
    assert onboarded.status_code == 200, onboarded.text
    grant(http, new_key)
    captured = http.post(
        "/v1/captures",
        headers=bearer(new_key),
        json={"subject": "alice", **interaction("I live in Lisbon")},
    )
    assert captured.status_code == 201, captured.text
    served = http.post(
        "/v1/slices",
        headers=bearer(new_key),
        json={
            "subject": "alice",
            "query": "where do I live?",
            "budget_tokens": 256,
            "purpose": "personalization",
            "agent_id": "agent:one",
        },
    )
    assert served.status_code == 200, served.text
    assert "Lisbon" in served.json()["text"]
    assert {i["category"] for i in served.json()["items"]} == {"location"}


def test_readiness_says_when_the_policy_store_is_unreadable(
    http: httpx.Client, backend: Backend, settings: Settings
) -> None:
    assert http.get("/readyz").status_code == 200
    _rename_policy_table(backend, settings)
    try:
        response = http.get("/readyz")
        assert response.status_code == 503
        assert "policy store unreadable" in response.json()["detail"]
    finally:
        _rename_policy_table(backend, settings, back=True)
    assert http.get("/readyz").status_code == 200


def test_the_console_policy_page_changes_the_policy_with_a_csrf_checked_form(
    server: LiveServer, apps: Apps, kernel: Uprof
) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as console:
        assert (
            console.post("/console/login", data={"api_key": apps.planner_operator}).status_code
            == 303
        )
        page = console.get("/console/policy")
        assert page.status_code == 200 and 'id="policy-version">1<' in page.text
        csrf = csrf_of(page.text)
        form = {"app_id": "app:calendar", "role": "role:assistant"}

        forged = console.post("/console/policy/grant", data=form)
        assert forged.status_code == 403
        assert len(kernel.policy_history()) == 1

        bad = console.post(
            "/console/policy/grant",
            data={"csrf": csrf, "app_id": "app:calendar", "role": "role:ghost"},
        )
        assert bad.status_code == 422 and "unknown role" in bad.text
        assert len(kernel.policy_history()) == 1

        done = console.post("/console/policy/grant", data={"csrf": csrf, **form})
        assert done.status_code == 200 and 'id="policy-done"' in done.text
        assert 'id="policy-version">2<' in done.text
        label = f"{PLANNER}#{key_id(apps.planner_operator)}"
        assert kernel.policy_history()[-1].requested_by == label

        rules = console.post(
            "/console/policy/grant",
            data={
                "csrf": csrf,
                "app_id": "app:calendar",
                "actions": ["read", "capture"],
                "categories": ["diet"],
                "purpose": "scheduling",
            },
        )
        assert rules.status_code == 200 and len(kernel.policy_history()) == 4

        undone = console.post("/console/policy/revoke", data={"csrf": csrf, **form})
        assert undone.status_code == 200 and 'id="policy-version">5<' in undone.text
        assert "role.revoked" in undone.text
