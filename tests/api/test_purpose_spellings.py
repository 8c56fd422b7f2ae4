"""Purposes spelled oddly never match another purpose (hostile callers round 7: held;
both backends, live server).

The planner holds alice's consent for ``personalization`` only and the policy lets it read
for that purpose. A slice asked for a near spelling of it (case, blanks, a line end, a
zero-width or full-width character, the policy's wildcard ``*``) or a consent granted for
one is refused: a consent 422 (not a purpose) or 403 (no policy row); a slice 422 naming
``purpose`` (not a token) or 200 with every item withheld by the policy (a token the
policy has no row for, uppercase included). Nothing of alice is served.
"""

from __future__ import annotations

import httpx

from tests.api.conftest import Apps, bearer, grant, interaction

SPELLINGS = (
    "Personalization",
    "PERSONALIZATION",
    " personalization",
    "personalization ",
    "personalization\n",
    "personalization\u200b",
    "\uff50ersonalization",
    "personalizat\u0131on",
    "*",
    "personalization,scheduling",
)


def test_held_no_near_spelling_of_a_purpose_is_served(http: httpx.Client, apps: Apps) -> None:
    grant(http, apps.planner, purposes=("personalization",))
    done = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I am vegetarian")},
    )
    assert done.status_code == 201, done.text
    for purpose in SPELLINGS:
        sliced = http.post(
            "/v1/slices",
            headers=bearer(apps.planner),
            json={
                "subject": "alice",
                "query": "diet",
                "budget_tokens": 200,
                "purpose": purpose,
                "agent_id": "agent:one",
            },
        )
        # A slice withholds what the policy does not allow (200, nothing served, counted
        # under ``withheld``); what is no purpose at all is a 422 naming it.
        assert sliced.status_code in (200, 422), (purpose, sliced.text[:300])
        if sliced.status_code == 422:
            assert "purpose" in {f["field"] for f in sliced.json()["error"]["fields"]}, purpose
        else:
            assert sliced.json()["items"] == [], purpose
            assert sliced.json()["withheld"], purpose
        assert "vegetarian" not in sliced.text
        consented = http.post(
            "/v1/consents",
            headers=bearer(apps.planner),
            json={
                "subject": "alice",
                "categories": ["*"],
                "purposes": [purpose],
                "collected_by": "consent-ui:test",
            },
        )
        assert consented.status_code in (403, 422), (purpose, consented.text[:300])
