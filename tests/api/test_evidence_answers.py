"""A proposal citing a capture that is not the subject's is refused one way, naming the field.

Found in a hostile-caller review (2026-12-05): an app holding a capture id it should not
(another app's, copied from a shared provenance label, or its own of another subject)
proposed an item for a subject it holds a consent of, citing it. The answer told the ids
apart: "evidence ... belongs to another subject" for a capture that exists elsewhere,
"does not name a captured event" for an id that names none, so the app learned that the id
is a real capture and, trying its subjects one by one, whose it is. Both answers were
``evidence_invalid`` with an empty ``error.fields``. On the code before the fix both
assertions below failed (SQLite and PostgreSQL).
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.api.conftest import Apps, bearer, grant, interaction
from uprof.kernel import Uprof


def _propose(http: httpx.Client, key: str, subject: str, evidence: str) -> httpx.Response:
    memory = {"kind": "memory", "text": "likes tea", "category": "preference"}
    return http.post(
        "/v1/proposals",
        headers=bearer(key),
        json={
            "subject": subject,
            "agent_id": "agent:one",
            "purpose": "personalization",
            "proposals": [
                {**memory, "evidence": []},
                {**memory, "evidence": [evidence]},
            ],
        },
    )


def test_evidence_of_another_subject_is_answered_as_evidence_that_does_not_exist(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    for subject in ("alice", "bob"):
        grant(http, apps.planner, subject)
    shared = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I like green tea", sharing="shared")},
    )
    assert shared.status_code == 201, shared.text
    assert kernel.wait_until_caught_up(30)  # the capture is in the views
    answers: list[Any] = []
    for capture_id in (shared.json()["capture_id"], "f" * 32):
        response = _propose(http, apps.planner, "bob", capture_id)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert [f["field"] for f in error["fields"]] == ["proposals.1.evidence"], error
        answers.append((error["code"], error["message"].replace(capture_id, "<id>")))
    assert answers[0] == answers[1]
