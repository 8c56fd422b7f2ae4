"""Review of 0204: attacks on its slice-names rule (QK) that found nothing, kept.

A slice naming a subject beside a session must not tell an app anything about a subject
it holds no consent of: the refusal of an unknown session says the same whatever stands
beside it (an existing subject the app does not hold, none, one erased), and the app's
own session beside such a subject is answered as the subject alone is.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.api.conftest import Apps, LiveServer, bearer, grant
from tests.api.test_sdk_export_to import BEFORE, answering
from tests.api.test_sdk_export_to import _both_ways as both_ways
from uprof.kernel import Uprof
from uprof.sdk import Client, ServiceUnavailableError, TransportError

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


class _Stalled:
    """An ASGI app answering the opening and ``size`` bytes of an export, then nothing
    until the client goes (a client killed mid-write)."""

    def __init__(self, size: int) -> None:
        self.size = size

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not await answering(scope, receive, send):
            return
        head = b'{"export":{"subject":"alice","blob":"' + b"x" * self.size
        await send({"type": "http.response.body", "body": head, "more_body": True})
        await anyio.sleep(120)


#: A child writing an export to argv[2] from argv[1], its file size limited to argv[3]
#: bytes when given (RLIMIT_FSIZE: "the disk is full"; Python ignores SIGXFSZ, so the
#: write fails with EFBIG instead of the process dying).
CHILD = """
import resource, sys
from uprof.sdk import Client
if len(sys.argv) > 3:
    limit = int(sys.argv[3])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
with Client(sys.argv[1], "k", timeout_s=120) as client:
    try:
        client.export_subject_to("alice", sys.argv[2])
    except Exception as error:
        print(type(error).__name__, error)
        sys.exit(3)
"""


def _child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE, text=True)


def test_held_a_client_killed_mid_write_leaves_the_path_and_the_next_export_clears_its_part(
    tmp_path: Path,
) -> None:
    dest = tmp_path / "alice.json"
    dest.write_text(BEFORE)
    with LiveServer(_Stalled(4 * 1024 * 1024)) as stalled:
        child = _child(stalled.url, str(dest))
        try:
            while not [p for p in tmp_path.iterdir() if p != dest and p.stat().st_size]:
                assert child.poll() is None, child.communicate()
                time.sleep(0.05)
        finally:
            child.send_signal(signal.SIGKILL)
            child.communicate()
    assert dest.read_text() == BEFORE
    assert len(list(tmp_path.iterdir())) == 2  # the dead client's part file
    document = {"subject": "alice"}
    with LiveServer(_Answer(json.dumps({"export": document}).encode())) as whole:
        with Client(whole.url, "k") as client:
            client.export_subject_to("alice", dest)
    assert json.loads(dest.read_text()) == document
    assert sorted(p.name for p in tmp_path.iterdir()) == [dest.name]


def test_held_a_full_disk_leaves_the_path_as_it_was(tmp_path: Path) -> None:
    dest = tmp_path / "alice.json"
    dest.write_text(BEFORE)
    body = json.dumps({"export": {"blob": "x" * 4 * 1024 * 1024}}).encode()
    with LiveServer(_Answer(body)) as live:
        child = _child(live.url, str(dest), str(1024 * 1024))
        said, _ = child.communicate(timeout=120)
    assert child.returncode == 3, said
    assert "File too large" in said, said
    assert dest.read_text() == BEFORE
    assert sorted(p.name for p in tmp_path.iterdir()) == [dest.name]


def test_held_concurrent_exports_to_one_path_leave_one_whole_document(tmp_path: Path) -> None:
    dest = tmp_path / "alice.json"
    document = {"subject": "alice", "blob": "x" * 1024 * 1024}
    with LiveServer(_Answer(json.dumps({"export": document}).encode())) as live:
        children = [_child(live.url, str(dest)) for _ in range(4)]
        for child in children:
            said, _ = child.communicate(timeout=120)
            assert child.returncode == 0, said
    assert json.loads(dest.read_text()) == document
    assert sorted(p.name for p in tmp_path.iterdir()) == [dest.name]


def test_held_a_folder_or_a_symlink_at_the_path(tmp_path: Path) -> None:
    """A folder at the path is refused (the folder stays); a symlink at it is replaced by
    the export (the file it pointed to stays as it was), as ``audit_export_to``."""
    document = {"subject": "alice"}
    target = tmp_path / "elsewhere.json"
    target.write_text(BEFORE)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    folder = tmp_path / "folder"
    folder.mkdir()
    with LiveServer(_Answer(json.dumps({"export": document}).encode())) as live:
        with Client(live.url, "k") as client:
            with pytest.raises(OSError):
                client.export_subject_to("alice", folder)
            client.export_subject_to("alice", link)
    assert folder.is_dir() and not list(folder.iterdir())
    assert not link.is_symlink() and json.loads(link.read_text()) == document
    assert target.read_text() == BEFORE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere.json", "folder", "link.json"]


class _Outage:
    """An ASGI app answering every request as uprof does during a policy-store outage
    (503 ``policy_store_unavailable``, ``Retry-After: 5``), counting them."""

    def __init__(self) -> None:
        self.requests = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answering(scope, receive, send)
            return
        while (await receive()).get("more_body"):
            pass
        self.requests += 1
        body = {"error": {"code": "policy_store_unavailable", "message": "policy store down"}}
        headers = [(b"content-type", b"application/json"), (b"retry-after", b"5")]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": json.dumps(body).encode()})


def test_held_the_sdk_sends_a_write_answered_as_the_outage_once(tmp_path: Path) -> None:
    """0204's QL: the SDK raises the outage with its code and Retry-After and does not
    send the write again (it resends only what got no answer)."""
    outage = _Outage()
    with LiveServer(outage) as live, Client(live.url, "k") as client:
        with pytest.raises(ServiceUnavailableError) as refused:
            client.capture("alice", agent_id="agent:one", user_input="I like tea")
    assert refused.value.code == "policy_store_unavailable"
    assert refused.value.retry_after_s == 5
    assert outage.requests == 1
