"""MCP tool errors outside outages (decision 0188's Left), review of 0186 and 0188.

- OY: a check across several arguments (a slice naming no subject, a capture with no
  text) was refused with the field ``body``, which no tool takes and no REST body field
  is: the caller was not told which argument to fix. The same bodies over REST said
  ``body`` too. Now the field the message asks for (``subject``, ``user_input``).
- Held: a fault (not an outage, not a refusal) raised under a tool leaks nothing of its
  text (a statement, its parameters, a path): the MCP SDK's generic crash text.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from mcp import Client as McpClient

from tests.api.conftest import PLANNER, Apps, LiveServer, bearer, interaction, planner_mcp_server
from uprof.api.scoped import AppScope
from uprof.kernel import Uprof

WHEN = "2025-01-01T09:00:00+00:00"
SLICE = {"agent_id": "agent:one", "query": "q", "purpose": "personalization", "budget_tokens": 100}
CAPTURE = {"subject": "alice", "agent_id": "agent:one", "occurred_at": WHEN}


def _fields(text: str) -> list[str]:
    return [f["field"] for f in json.loads(text)["error"]["fields"]]


def _tool_texts(kernel: Uprof, calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    async def scenario(server: Any) -> list[str]:
        async with McpClient(server) as client:
            texts = []
            for name, arguments in calls:
                result = await client.call_tool(name, arguments)
                assert result.is_error, result
                texts.append(" ".join(getattr(b, "text", "") for b in result.content))
            return texts

    with planner_mcp_server(kernel) as server:
        return asyncio.run(scenario(server))


def test_oy_a_check_across_arguments_names_the_argument_to_fix(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    """Bug OY: ``fields: [{"field": "body"}]`` for a slice naming no subject and a
    capture with no text, over MCP and REST; now the argument the message asks for."""
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    no_subject, no_text = _tool_texts(
        kernel,
        [
            ("profile_slice", SLICE),
            ("capture", {**CAPTURE, "user_input": " ", "agent_response": ""}),
        ],
    )
    assert _fields(no_subject) == ["subject"], no_subject
    assert _fields(no_text) == ["user_input"], no_text
    rest_slice = http.post("/v1/slices", headers=bearer(apps.planner), json=SLICE)
    rest_capture = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction(" ")},
    )
    for answer, field in ((rest_slice, "subject"), (rest_capture, "user_input")):
        assert answer.status_code == 422, answer.text
        assert _fields(answer.text) == [field], answer.text


@pytest.mark.parametrize(
    "fault",
    [
        sa.exc.IntegrityError(
            "INSERT INTO subject_index (name) VALUES (%(name)s)",
            {"name": "alice@example.com"},
            Exception("duplicate key value violates unique constraint"),
        ),
        RuntimeError("cannot read /srv/uprof/data.keys/master.key"),
    ],
    ids=["sql", "path"],
)
def test_a_fault_under_a_tool_leaks_nothing_of_its_text(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch, fault: Exception
) -> None:
    """Held: a fault (a constraint the driver reports, a file that cannot be read) leaks
    neither the statement, nor its parameters, nor the path to the agent. Bug QN: its
    text was the MCP SDK's "Error executing tool profile_slice", not REST's JSON body, so
    an agent branching on ``error.code`` found none; now REST's 500 body, ``internal``."""
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])

    def broken(self: AppScope, body: Any) -> Any:
        raise fault

    monkeypatch.setattr(AppScope, "slice", broken)
    (text,) = _tool_texts(kernel, [("profile_slice", {"subject": "alice", **SLICE})])
    for secret in ("INSERT", "subject_index", "alice@example.com", "/srv", "master.key"):
        assert secret not in text, text
    assert json.loads(text) == {
        "error": {"code": "internal", "message": "internal server error", "hint": "", "fields": []}
    }, text
