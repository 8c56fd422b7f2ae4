"""Review of 0204: attacks on its slice-names rule (QK) that found nothing, kept.

A slice naming a subject beside a session must not tell an app anything about a subject
it holds no consent of: the refusal of an unknown session says the same whatever stands
beside it (an existing subject the app does not hold, none, one erased), and the app's
own session beside such a subject is answered as the subject alone is.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.api.conftest import Apps, bearer, grant
from uprof.kernel import Uprof

SLICE = {"query": "what to cook", "budget_tokens": 200, "purpose": "personalization"}


def _slice(http: httpx.Client, key: str, **names: str) -> tuple[int, Any]:
    answer = http.post(
        "/v1/slices", headers=bearer(key), json={**SLICE, "agent_id": "agent:one", **names}
    )
    return answer.status_code, answer.json()


@pytest.fixture
def subjects(http: httpx.Client, apps: Apps, kernel: Uprof) -> None:
    """alice held by the planner, with the planner's session bound to her; bob held by
    the calendar only; carol held by the calendar, then erased."""
    grant(http, apps.planner, "alice")
    grant(http, apps.calendar, "bob", purposes=("scheduling",))
    grant(http, apps.calendar, "carol", purposes=("scheduling",))
    bound = http.post(
        "/v1/sessions",
        headers=bearer(apps.planner),
        json={"session_id": "s-alice", "subject": "alice"},
    )
    assert bound.status_code == 201, bound.text
    kernel.erase_subject("carol")


@pytest.mark.usefixtures("subjects")
def test_held_an_unknown_session_answers_alike_whatever_subject_stands_beside_it(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    before = len(list(kernel.audit_log.entries(action="access.denied")))
    answers = {
        (beside, session): _slice(http, apps.planner, subject=beside, session_id=session)
        for beside in ("alice", "bob", "carol", "nobody")
        for session in ("never", "S-ALICE", "s-alice\u0301")
    }
    assert {a for a, _ in answers.values()} == {422}, answers
    assert len({str(body) for _, body in answers.values()}) == 1, answers
    denied = list(kernel.audit_log.entries(action="access.denied"))[before:]
    assert len(denied) == len(answers), denied
    # The same entry each time, but for its time: nothing of the subject named.
    shapes = {
        json.dumps({k: v for k, v in json.loads(e.entry_json).items() if "_at" not in k})
        for e in denied
    }
    assert len(shapes) == 1, shapes


@pytest.mark.usefixtures("subjects")
def test_held_the_apps_own_session_beside_a_subject_answers_as_the_subject_alone(
    http: httpx.Client, apps: Apps
) -> None:
    for beside in ("bob", "carol", "nobody"):
        alone = _slice(http, apps.planner, subject=beside)
        with_session = _slice(http, apps.planner, subject=beside, session_id="s-alice")
        assert with_session == alone, (beside, alone, with_session)
