"""A consent grant refused at its write for a subject never seen before makes no subject
(SQLite and PostgreSQL, a live server, the key revoked by ``uprof apps revoke`` in a
process of its own while the grant waited for its writer turn, as TX's test does).

The grant makes the subject's index row and first key before its writer turn, then
saves the stream. Refused there (0218's TX, US here; or an outage), the row stayed with
no stream (0223-review-of-0218-and-0219's Left): every later road found a subject that
was never made. The privacy center and ``subject_exists`` said it exists, reads and the
export answered an empty profile, slices, captures and erasures "no such subject
stream" (a capture 404 where a subject never made gets 403 "no consent"), the erasure
could never remove it, and ``/v1/subjects/list`` listed it (bug UT). Each road is asked
here for the refused subject and for a name never used; the answers must be alike.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.conftest import (
    PLANNER,
    PRIVACY,
    LiveServer,
    bearer,
    interaction,
    revoke_with_the_cli,
)
from tests.api.test_consent_key_at_the_write import _change_after_its_turn
from uprof.api import ApiKeyStore
from uprof.apikeys.store import KEY_CACHE_TTL_S
from uprof.kernel import Uprof
from uprof.settings import Settings

REFUSED, NEVER = "zed", "nobody-ever"


def _grant(subject: str) -> dict[str, Any]:
    return {
        "subject": subject,
        "categories": ["*"],
        "purposes": ["personalization"],
        "collected_by": "consent-ui:test",
    }


def _answer(response: httpx.Response) -> tuple[int, Any]:
    """What a caller sees: the status and the body without the request's own ids."""
    try:
        body = response.json()
    except ValueError:
        return response.status_code, response.text
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = {k: v for k, v in body["error"].items() if k not in {"request_id", "trace_id"}}
    return response.status_code, body


def _roads(http: httpx.Client, planner: str, privacy: str, operator: str, subject: str) -> Any:
    """Every road a caller meets for ``subject``: its answers."""
    return {
        "consents": _answer(
            http.post("/v1/consents/list", headers=bearer(planner), json={"subject": subject})
        ),
        "profile": _answer(
            http.post("/v1/profile/read", headers=bearer(privacy), json={"subject": subject})
        ),
        "capture": _answer(
            http.post(
                "/v1/captures",
                headers=bearer(planner),
                json={"subject": subject, **interaction("I live in Oslo")},
            )
        ),
        "slice": _answer(
            http.post(
                "/v1/slices",
                headers=bearer(planner),
                json={
                    "subject": subject,
                    "query": "where do I live?",
                    "budget_tokens": 256,
                    "purpose": "personalization",
                    "agent_id": "agent:one",
                },
            )
        ),
        "export": _answer(
            http.post("/v1/governance/exports", headers=bearer(privacy), json={"subject": subject})
        ),
        "erasure": _answer(
            http.post(
                "/v1/governance/erasures/subject",
                headers=bearer(privacy),
                json={"subject": subject},
            )
        ),
    }


def _listed(http: httpx.Client, operator: str) -> list[str]:
    listed = http.post("/v1/subjects/list", headers=bearer(operator), json={})
    assert listed.status_code == 200, listed.text
    return [s["pseudonym"] for s in listed.json()["items"]]


def test_ut_a_first_grant_refused_at_its_write_leaves_no_subject_behind(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug UT: the refused subject answers every road as a name never used, is not
    listed, and a later grant (a live key) makes it a subject as any first grant."""
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    revoked = keys.create(PLANNER)
    planner = keys.create(PLANNER).token
    privacy = keys.create(PRIVACY).token
    operator = keys.create(PLANNER, ["app", "operator"]).token

    def revoked_elsewhere(http: httpx.Client) -> None:
        revoke_with_the_cli(settings, revoked.info.key_id)
        clock[0] += KEY_CACHE_TTL_S + 0.1  # the server's read of the row has aged
        refused = http.post(
            "/v1/consents/list", headers=bearer(revoked.token), json={"subject": REFUSED}
        )
        assert refused.status_code == 401, refused.text

    answer = _change_after_its_turn(
        server,
        kernel,
        monkeypatch,
        "/v1/consents",
        _grant(REFUSED),
        revoked.token,
        revoked_elsewhere,
    )
    assert answer.status_code == 401, answer.text
    monkeypatch.undo()

    with httpx.Client(base_url=server.url, timeout=60) as http:
        refused_roads = _roads(http, planner, privacy, operator, REFUSED)
        never_roads = _roads(http, planner, privacy, operator, NEVER)
        refused_roads["listed"] = never_roads["listed"] = (200, _listed(http, operator))
        refused_roads["exists"] = (200, kernel.subject_exists(REFUSED))
        never_roads["exists"] = (200, kernel.subject_exists(NEVER))
        differ = {road: (refused_roads[road], never_roads[road]) for road in never_roads}
        assert refused_roads == never_roads, {
            road: pair for road, pair in differ.items() if pair[0] != pair[1]
        }
        assert refused_roads["consents"][0] == 404
        assert refused_roads["listed"] == (200, [])

        granted = http.post("/v1/consents", headers=bearer(planner), json=_grant(REFUSED))
        assert granted.status_code == 201, granted.text
        captured = http.post(
            "/v1/captures",
            headers=bearer(planner),
            json={"subject": REFUSED, **interaction("I live in Oslo")},
        )
        assert captured.status_code == 201, captured.text
        assert _listed(http, operator) == [captured.json()["subject_pseudonym"]]
        assert kernel.subject_exists(REFUSED) is True
