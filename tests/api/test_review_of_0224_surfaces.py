"""The embedded SDK and MCP meeting an event table damaged under them
(0228-review-of-0224-and-store-shapes, 0220-event-table-shape-at-start's Left): both go
through the guarded recorder the servers use, so the answer must be uprof's damage error
(``stored_data_damaged``, the restore hint), never a traceback or ``internal``. A column
renamed by hand (0220's TT): held, on main at 608a2a6d too. On PostgreSQL ``state``
turned to TEXT: bug VA on these surfaces (on main the SDK's ``internal``, MCP's "raised an
unexpected exception", 2 of 2)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.api.conftest import MCP_CAPTURE, PLANNER, planner_mcp_server
from tests.conftest import Backend
from tests.e2e.test_event_table_shape import TABLES
from tests.e2e.test_review_of_0220 import _alter_by_hand
from tests.kernel.conftest import consent
from uprof.kernel import Uprof
from uprof.sdk import APIError, Client

#: (backend kinds, statement on the event table): what is done by hand under the caller.
DAMAGES = [
    pytest.param(
        ("sqlite", "postgres"),
        "ALTER TABLE {t} RENAME COLUMN topic TO topic_by_hand",
        id="topic-renamed",
    ),
    pytest.param(
        ("postgres",),
        "ALTER TABLE {t} ALTER COLUMN state TYPE text USING encode(state, 'hex')",
        id="state-text",
    ),
]


def _skip_unless_a_damage_of(backend: Backend, kinds: tuple[str, ...]) -> None:
    # Asked before any client starts: a skip raised inside MCP's task group would be
    # reported as the group's unhandled error, not as this reason.
    if backend.kind not in kinds:
        pytest.skip(f"not a damage of {backend.kind}'s")


def _damage(backend: Backend, kernel: Uprof, kinds: tuple[str, ...], statement: str) -> None:
    assert backend.kind in kinds
    _alter_by_hand(backend, kernel.settings, statement.format(t=TABLES[backend.kind]["events"]))


def _said(caller: str, error: Any, text: str) -> None:
    assert error["code"] == "stored_data_damaged", (caller, error)
    assert "uprof restore" in error["hint"], (caller, error)
    for words in ("topic", "state", "stored_events", "profiles_events", "SELECT"):
        assert words not in text, (caller, text)


@pytest.mark.parametrize(("kinds", "statement"), DAMAGES)
def test_the_embedded_sdk_meets_a_damaged_event_table_as_damage(
    backend: Backend, kernel: Uprof, kinds: tuple[str, ...], statement: str
) -> None:
    _skip_unless_a_damage_of(backend, kinds)
    consent(kernel, "alice")
    client = Client.embedded(kernel, PLANNER)
    try:
        client.capture("alice", agent_id="agent:one", user_input="I like tea")
        _damage(backend, kernel, kinds, statement)
        for _ in range(2):
            with pytest.raises(APIError) as refused:
                client.capture("alice", agent_id="agent:one", user_input="I like coffee")
            error = refused.value
            assert error.status == 500, error
            _said("sdk", {"code": error.code, "hint": error.hint}, str(error))
    finally:
        client.close()


@pytest.mark.parametrize(("kinds", "statement"), DAMAGES)
def test_mcp_meets_a_damaged_event_table_as_damage(
    backend: Backend, kernel: Uprof, kinds: tuple[str, ...], statement: str
) -> None:
    from mcp import Client as McpClient

    _skip_unless_a_damage_of(backend, kinds)
    consent(kernel, "alice")

    async def scenario(server: Any) -> list[Any]:
        async with McpClient(server) as client:
            first = await client.call_tool("capture", MCP_CAPTURE)
            assert not first.is_error, first
            _damage(backend, kernel, kinds, statement)
            return [
                await client.call_tool(
                    "capture", {**MCP_CAPTURE, "idempotency_key": f"m-{n}", "user_input": "x"}
                )
                for n in (2, 3)
            ]

    with planner_mcp_server(kernel) as server:
        answers = asyncio.run(scenario(server))
    for answer in answers:
        assert answer.is_error, answer
        text = answer.content[0].text
        _said("mcp", json.loads(text)["error"], text)
