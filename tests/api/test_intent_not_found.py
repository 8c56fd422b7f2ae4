"""An intent update that names no intent the agent may see is 404 ``intent_not_found``.

It was ``subject_not_found`` with the hint "check the subject reference" for a subject the
app had just written to (0209's Left). An intent another agent keeps private answers
exactly as one that does not exist: the code changed, not what the caller learns.
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.api.conftest import Apps, bearer, grant

GOAL = "book a trip to Lisbon in May"


def _propose(http: httpx.Client, key: str, agent: str, proposal: dict[str, Any]) -> httpx.Response:
    body = {"subject": "alice", "agent_id": agent, "sharing": "private", "proposals": [proposal]}
    return http.post("/v1/proposals", headers=bearer(key), json=body)


def test_an_update_of_no_visible_intent_is_404_intent_not_found_alike(
    http: httpx.Client, apps: Apps
) -> None:
    """main at bc87b807: both refusals were 404 ``subject_not_found`` hinting at the
    subject reference."""
    grant(http, apps.planner)
    made = _propose(http, apps.planner, "agent:one", {"kind": "intent", "description": GOAL})
    assert made.status_code == 200, made.text
    refusals = []
    for agent, target in (
        ("agent:two", {"description": GOAL}),  # agent:one's private intent
        ("agent:one", {"intent_id": "no-such-intent"}),
        ("agent:one", {"description": "adopt a cat"}),
    ):
        update = {"kind": "intent_update", "status": "fulfilled", **target}
        refused = _propose(http, apps.planner, agent, update)
        assert refused.status_code == 404, refused.text
        refusals.append(refused.json())
    assert refusals[0]["error"]["code"] == "intent_not_found", refusals[0]
    assert "intent" in refusals[0]["error"]["hint"], refusals[0]
    assert "subject reference" not in refusals[0]["error"]["hint"], refusals[0]
    assert refusals[0] == refusals[1] == refusals[2]
    owner = _propose(
        http,
        apps.planner,
        "agent:one",
        {"kind": "intent_update", "status": "fulfilled", "description": GOAL},
    )
    assert owner.status_code == 200, owner.text  # nothing was spent by the refusals
