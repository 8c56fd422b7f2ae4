"""An identifier an app binds is that app's alone, whatever the case of the app ids.

Identifiers (e-mail addresses) match case-insensitively, so the resolver folded the case of
the whole key it looks up, which is the app's namespace followed by the identifier. App ids
are case-sensitive (``app:Planner`` and ``app:planner`` are two apps, two policy subjects),
so two apps whose ids differ only in case shared one namespace: one app rebound the
other's identifier to another subject, and the other's next slice by that identifier
served that subject's profile. Reproduced over REST on the code before the fix (a slice
for "alice@example.com" answered with bob's memory), on SQLite and PostgreSQL.
"""

from __future__ import annotations

import httpx

from domain.principal import Principal
from tests.api.conftest import PLANNER, Apps, bearer, grant, interaction
from uprof.api import ApiKeyStore
from uprof.facade import Facade
from uprof.kernel import Uprof

TWIN = "app:Planner"  # PLANNER is "app:planner"


def _slice_text(http: httpx.Client, key: str, identifier: str) -> str:
    response = http.post(
        "/v1/slices",
        headers=bearer(key),
        json={
            "identifier": identifier,
            "query": "food",
            "budget_tokens": 200,
            "purpose": "personalization",
            "agent_id": "agent:one",
        },
    )
    assert response.status_code == 200, response.text
    return str(response.json()["text"])


def test_an_app_whose_id_differs_only_in_case_cannot_rebind_anothers_identifier(
    http: httpx.Client, apps: Apps, keys: ApiKeyStore, kernel: Uprof
) -> None:
    twin = keys.create(TWIN).token
    operator = Facade(kernel, Principal.local_operator(kernel.subjects.tenant))
    operator.policy_grant(app_id=TWIN, role="role:assistant", actions=[], categories=[])
    for key in (apps.planner, twin):
        for subject in ("alice", "bob"):
            grant(http, key, subject)
    for subject, text in (("alice", "I am vegetarian"), ("bob", "I love steak")):
        captured = http.post(
            "/v1/captures",
            headers=bearer(apps.planner),
            json={"subject": subject, **interaction(text)},
        )
        assert captured.status_code == 201, captured.text
    for key, subject in ((apps.planner, "alice"), (twin, "bob")):
        bound = http.post(
            "/v1/identifiers",
            headers=bearer(key),
            json={"identifier": "Alice@Example.com", "subject": subject},
        )
        assert bound.status_code == 201, bound.text

    # Each app resolves its own binding, the identifier's case folded within it.
    planner_sees = _slice_text(http, apps.planner, "alice@example.COM")
    assert "vegetarian" in planner_sees and "steak" not in planner_sees, PLANNER
    twin_sees = _slice_text(http, twin, "ALICE@example.com")
    assert "steak" in twin_sees and "vegetarian" not in twin_sees, TWIN
