"""Review of 0204: attacks on its slice-names rule (QK) that found nothing, kept.

A slice naming a subject beside a session must not tell an app anything about a subject
it holds no consent of: the refusal of an unknown session says the same whatever stands
beside it (an existing subject the app does not hold, none, one erased), and the app's
own session beside such a subject is answered as the subject alone is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import Apps, LiveServer, bearer, grant
from tests.api.test_sdk_export_to import BEFORE, answering
from tests.api.test_sdk_export_to import _both_ways as both_ways
from uprof.kernel import Uprof
from uprof.sdk import TransportError

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


class _Answer:
    """An ASGI app answering every request 200 with ``body``, as a server not uprof's (or
    an answer cut where an inner object closes) could."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answering(scope, receive, send):
            await send({"type": "http.response.body", "body": self.body, "more_body": False})


#: Answers that end in a closing brace but are no ``{"export": {...}}``: the document cut
#: after an inner object closed, a key after the document, a document that is no object,
#: one closed twice.
MALFORMED = (
    b'{"export": {"subject": "alice", "consents": {"a": 1}',
    b'{"export": {"subject": "alice"}, "more": {"b": 2}}',
    b'{"export": ["alice"]}}',
    b'{"export": {"subject": "alice"}}}',
    b'{"export": {"subject": "al\\"}"}',
)


@pytest.mark.parametrize("body", MALFORMED, ids=range(len(MALFORMED)))
def test_qy_a_malformed_export_answer_leaves_the_path_as_it_was(
    body: bytes, tmp_path: Path
) -> None:
    """Bug QY. On main each is written at the path as the export (the text between the
    opening and the last brace), ``export_subject_to`` returning as done."""
    dest = tmp_path / "alice.json"
    dest.write_text(BEFORE)
    with LiveServer(_Answer(body)) as live:
        for outcome in both_ways(live.url, dest):
            assert isinstance(outcome, TransportError), (body, outcome, dest.read_text())
            assert "not a whole" in str(outcome)
            assert dest.read_text() == BEFORE
            assert sorted(p.name for p in tmp_path.iterdir()) == [dest.name]


def test_held_a_whole_export_with_braces_and_escapes_in_its_strings_is_written(
    tmp_path: Path,
) -> None:
    document = {"subject": 'a}"\\', "memories": [{"text": '{[}]\\\\"'}], "n": {}}
    dest = tmp_path / "alice.json"
    body = json.dumps({"export": document}).encode()
    with LiveServer(_Answer(body)) as live:
        for outcome in both_ways(live.url, dest):
            assert outcome is None, outcome
            assert json.loads(dest.read_text()) == document


def test_qy_the_document_is_followed_across_any_split_of_the_answer() -> None:
    """QY, wherever the answer is cut into chunks (inside an escape too): a whole answer is
    written as its document, one cut before its last brace is refused at every split."""
    from uprof.sdk._client import _ExportDocument

    document = json.dumps({"s": 'a}"\\\\\\"', "l": [{"t": "{[}]"}], "n": {}})
    for answer, whole in ((f'{{"export": {document}}}', True), (f'{{"export": {document}', False)):
        for at in range(len(answer) + 1):
            reader, written = _ExportDocument(), []
            try:
                for piece in (answer[:at], answer[at:]):
                    written.append(reader.feed(piece))
                reader.end()
            except TransportError:
                assert not whole, at
            else:
                assert whole and "".join(written).strip() == document, at
