"""A slice whose names do not all resolve to one subject is refused (I5: ambiguity is an
error), on REST, MCP, the embedded and the HTTP SDK and both backends (0193's Left).

Bug QK: a slice naming a subject *and* a session id (or identifier) this app never
registered, or one another app registered, was served for the subject: the unresolved
name was dropped as if it had not been sent. Now it is refused, 422
``identity_unresolved`` naming the field (``session_id``, ``identifier``), nothing served,
``access.denied`` audited; an unknown session and another app's are answered alike, and
alike whatever subject is named beside them (no existence oracle: the session is looked
up in the app's own namespace before any subject).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from mcp import Client as McpClient

from tests.api.conftest import (
    Apps,
    LiveServer,
    bearer,
    grant,
    interaction,
    planner_mcp_server,
)
from uprof.kernel import Uprof
from uprof.sdk import Client, InvalidRequestError

SLICE = {"query": "what to cook", "budget_tokens": 200, "purpose": "personalization"}


def _slice(http: httpx.Client, key: str, **names: str) -> httpx.Response:
    return http.post(
        "/v1/slices", headers=bearer(key), json={**SLICE, "agent_id": "agent:one", **names}
    )


def _refusal(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == "identity_unresolved", error
    return error


@pytest.fixture
def alice(http: httpx.Client, apps: Apps) -> None:
    """alice, held by the planner (with a capture) and by the calendar; the calendar
    binds its own session and identifier to her."""
    grant(http, apps.planner, "alice")
    grant(http, apps.calendar, "alice", purposes=("scheduling",))
    captured = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I am vegetarian")},
    )
    assert captured.status_code == 201, captured.text
    for path, field in (("/v1/sessions", "session_id"), ("/v1/identifiers", "identifier")):
        bound = http.post(
            path,
            headers=bearer(apps.calendar),
            json={field: "calendar-only", "subject": "alice"},
        )
        assert bound.status_code == 201, bound.text


@pytest.mark.usefixtures("alice")
@pytest.mark.parametrize("field", ["session_id", "identifier"])
def test_qk_a_name_the_app_never_registered_beside_the_subject_is_refused(
    http: httpx.Client, apps: Apps, kernel: Uprof, field: str
) -> None:
    denied_before = len(list(kernel.audit_log.entries(action="access.denied")))
    never = _refusal(_slice(http, apps.planner, subject="alice", **{field: "never-registered"}))
    assert never["fields"] == [{"field": field, "message": never["message"]}], never
    # Another app's name is this app's unknown one: the same answer, word for word.
    foreign = _refusal(_slice(http, apps.planner, subject="alice", **{field: "calendar-only"}))
    assert foreign == never
    # Whatever subject stands beside it: no word on whether that subject exists.
    nobody = _refusal(_slice(http, apps.planner, subject="nobody", **{field: "never-registered"}))
    assert nobody == never
    denied = list(kernel.audit_log.entries(action="access.denied"))
    assert len(denied) == denied_before + 3, denied
    # Guard: the subject alone is served.
    assert _slice(http, apps.planner, subject="alice").status_code == 200


def test_held_a_captures_session_is_a_label_not_a_name(http: httpx.Client, apps: Apps) -> None:
    """A capture's ``session_id`` is the app's label of the conversation, never resolved:
    one the app never registered is taken (the capture's ``subject`` decides)."""
    grant(http, apps.planner, "alice")
    captured = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", "session_id": "never-registered", **interaction("hi")},
    )
    assert captured.status_code == 201, captured.text


@pytest.mark.usefixtures("alice")
def test_qk_the_sdks_and_mcp_refuse_alike(server: LiveServer, apps: Apps, kernel: Uprof) -> None:
    call = {**SLICE, "agent_id": "agent:one"}
    with (
        Client(server.url, apps.planner) as remote,
        Client.embedded(kernel, "app:planner") as local,
    ):
        for sdk in (remote, local):
            with pytest.raises(InvalidRequestError) as refused:
                sdk.slice("alice", session_id="never-registered", **call)
            assert refused.value.code == "identity_unresolved"
            assert [f.field for f in refused.value.fields] == ["session_id"]

    async def scenario(mcp_server: Any) -> str:
        async with McpClient(mcp_server) as client:
            result = await client.call_tool(
                "profile_slice", {**call, "subject": "alice", "session_id": "never-registered"}
            )
            assert result.is_error, result
            return " ".join(getattr(b, "text", "") for b in result.content)

    with planner_mcp_server(kernel) as mcp_server:
        text = asyncio.run(scenario(mcp_server))
    error = json.loads(text)["error"]
    assert error["code"] == "identity_unresolved", text
    assert [f["field"] for f in error["fields"]] == ["session_id"], text


@pytest.mark.usefixtures("alice")
def test_held_names_that_agree_are_served_and_names_that_disagree_refused(
    http: httpx.Client, apps: Apps
) -> None:
    """The app's own session bound to the named subject is served; bound to another
    subject it holds is refused as ambiguous (held on main)."""
    grant(http, apps.planner, "bob")
    for subject in ("alice", "bob"):
        bound = http.post(
            "/v1/sessions",
            headers=bearer(apps.planner),
            json={"session_id": f"s-{subject}", "subject": subject},
        )
        assert bound.status_code == 201, bound.text
    assert _slice(http, apps.planner, subject="alice", session_id="s-alice").status_code == 200
    assert _slice(http, apps.planner, session_id="s-alice").status_code == 200
    ambiguous = _refusal(_slice(http, apps.planner, subject="alice", session_id="s-bob"))
    assert "ambiguous" in ambiguous["message"], ambiguous
    # A session alone that the app never registered: refused as before.
    _refusal(_slice(http, apps.planner, session_id="never-registered"))
