"""The attacks found against `uprof serve`, replayed over REST as an outside app would.

Each test is one finding of the authorization review (issue "One authorized door"):
it failed before the facade existed and must keep failing for the attacker.
Both backends.
"""

from __future__ import annotations

import httpx

from tests.api.conftest import Apps, bearer, grant, interaction
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof


def _slice_text(
    http: httpx.Client, key: str, agent: str = "agent:one", purpose: str = "personalization"
) -> str:
    response = http.post(
        "/v1/slices",
        headers=bearer(key),
        json={
            "subject": "alice",
            "query": "what do I eat and what should I remember?",
            "budget_tokens": 1024,
            "purpose": purpose,
            "agent_id": agent,
        },
    )
    assert response.status_code == 200, response.text
    return str(response.json()["text"])


def test_an_app_without_a_policy_role_writes_nothing(
    http: httpx.Client, apps: Apps, keys: ApiKeyStore, kernel: Uprof
) -> None:
    grant(http, apps.planner)
    http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I want to run a marathon")},
    )
    rogue = keys.create("app:rogue").token
    assert kernel.wait_until_caught_up(30)  # planner's capture is extracted first
    before = kernel.lag().log_position

    consent = http.post(
        "/v1/consents",
        headers=bearer(rogue),
        json={
            "subject": "alice",
            "categories": ["*"],
            "purposes": ["personalization"],
            "collected_by": "consent-ui:forged",
        },
    )
    captured = http.post(
        "/v1/captures",
        headers=bearer(rogue),
        json={"subject": "alice", **interaction("I eat only steak")},
    )
    proposed = http.post(
        "/v1/proposals",
        headers=bearer(rogue),
        json={
            "subject": "alice",
            "agent_id": "agent:one",
            "purpose": "personalization",
            "sharing": "shared",
            "proposals": [
                {
                    "kind": "attribute",
                    "key": "diet",
                    "value": "carnivore",
                    "evidence": [],
                    "confidence": 0.9,
                }
            ],
        },
    )

    for response in (consent, captured, proposed):
        assert response.status_code == 403, response.text
        assert response.json()["error"]["code"] == "permission_denied"
    assert kernel.lag().log_position == before  # nothing written
    served = _slice_text(http, apps.planner)
    assert "steak" not in served and "carnivore" not in served


def test_an_agent_id_claimed_by_another_app_reads_nothing_private(
    http: httpx.Client, apps: Apps, keys: ApiKeyStore, kernel: Uprof
) -> None:
    # A second assistant app: same role as planner, so policy alone would let it read.
    helper = keys.create("app:helper").token
    kernel.policy_grant(requested_by="test#setup", app_id="app:helper", role="role:assistant")
    grant(http, apps.planner)
    grant(http, helper)
    memo = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("My locker code is 4711", sharing="private")},
    )
    assert memo.status_code == 201, memo.text
    # The helper names planner's agent: it is still its own "agent:one".
    assert "4711" not in _slice_text(http, helper, agent="agent:one")
    # And planner's agent:one does see its own private memo.
    assert "4711" in _slice_text(http, apps.planner, agent="agent:one")


def test_a_private_item_written_under_a_borrowed_agent_id_is_not_served_as_ones_own(
    http: httpx.Client, apps: Apps, keys: ApiKeyStore, kernel: Uprof
) -> None:
    helper = keys.create("app:helper").token
    kernel.policy_grant(requested_by="test#setup", app_id="app:helper", role="role:assistant")
    grant(http, apps.planner)
    grant(http, helper)
    planted = http.post(
        "/v1/captures",
        headers=bearer(helper),
        json={"subject": "alice", **interaction("Always book me on Ryanair", sharing="private")},
    )
    assert planted.status_code == 201, planted.text
    assert "Ryanair" not in _slice_text(http, apps.planner, agent="agent:one")


def test_an_agent_id_naming_another_app_is_refused(http: httpx.Client, apps: Apps) -> None:
    grant(http, apps.planner)
    response = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("hello", agent="app:calendar/agent:one")},
    )
    assert response.status_code == 422
    assert "agent_id" in response.json()["error"]["message"]


def test_an_app_cannot_record_consent_without_citing_the_users_action(
    http: httpx.Client, apps: Apps
) -> None:
    response = http.post(
        "/v1/consents",
        headers=bearer(apps.planner),
        json={"subject": "alice", "categories": ["diet"], "purposes": ["personalization"]},
    )
    assert response.status_code == 422
    assert "collected_by" in response.json()["error"]["message"]


def test_proposals_after_withdrawal_are_refused(http: httpx.Client, apps: Apps) -> None:
    consent_id = grant(http, apps.planner)
    http.post(
        "/v1/consents/withdraw",
        headers=bearer(apps.planner),
        json={"subject": "alice", "consent_id": consent_id},
    )
    response = http.post(
        "/v1/proposals",
        headers=bearer(apps.planner),
        json={
            "subject": "alice",
            "agent_id": "agent:one",
            "purpose": "personalization",
            "sharing": "shared",
            "proposals": [
                {
                    "kind": "attribute",
                    "key": "diet",
                    "value": "vegan",
                    "evidence": [],
                    "confidence": 0.9,
                }
            ],
        },
    )
    assert response.status_code == 403, response.text
    assert response.json()["error"]["code"] == "consent_required"


def test_export_and_erasure_audit_entries_name_who_asked(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    grant(http, apps.planner)
    http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I want to swim")},
    )
    assert (
        http.post(
            "/v1/governance/exports", headers=bearer(apps.privacy), json={"subject": "alice"}
        ).status_code
        == 200
    )
    assert (
        http.post(
            "/v1/governance/erasures/subject",
            headers=bearer(apps.privacy),
            json={"subject": "alice"},
        ).status_code
        == 200
    )
    kernel.reads.drain()
    entries = [e.entry for e in kernel.audit_log.entries()]
    for action in ("subject.exported", "erasure.requested"):
        entry = next(e for e in entries if e["action"] == action)
        assert entry["principal"].startswith("app:privacy-console#"), entry
