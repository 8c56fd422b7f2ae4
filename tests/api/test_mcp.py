"""The MCP server through the official MCP Python client: in-process, stdio, streamable HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.api.conftest import PLANNER, LiveServer
from tests.conftest import Backend
from uprof.api import ApiKeyStore
from uprof.api.runtime import ServiceRuntime
from uprof.apikeys.store import Principal
from uprof.kernel import Uprof
from uprof.mcp import build_server

WHEN = "2025-01-01T09:00:00+00:00"


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(scenario())


def text_of(result: Any) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content)


def error_code(result: Any) -> str | None:
    """The REST error code of a failed tool call (its text is the REST error body)."""
    if not result.is_error:
        return None
    return str(json.loads(text_of(result))["error"]["code"])


async def exercise(client: Client) -> dict[str, Any]:
    """Tools and resource as an agent would use them; returns what it observed."""
    seen: dict[str, Any] = {}
    tools = await client.list_tools()
    seen["tools"] = sorted(t.name for t in tools.tools)
    refused = await client.call_tool(
        "capture",
        {
            "subject": "alice",
            "agent_id": "agent:one",
            "user_input": "I want to learn the cello",
            "occurred_at": WHEN,
        },
    )
    seen["refused"] = error_code(refused) == "consent_required"
    return seen


async def after_consent(client: Client) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    ack = await client.call_tool(
        "capture",
        {
            "subject": "alice",
            "agent_id": "agent:one",
            "user_input": "I want to learn the cello",
            "sharing": "shared",
            "occurred_at": WHEN,
        },
    )
    assert not ack.is_error, text_of(ack)
    capture_id = ack.structured_content["capture_id"]
    sliced = await client.call_tool(
        "profile_slice",
        {
            "subject": "alice",
            "query": "what instrument?",
            "agent_id": "agent:one",
            "purpose": "personalization",
            "budget_tokens": 200,
        },
    )
    assert not sliced.is_error, text_of(sliced)
    seen["slice_has_cello"] = "cello" in sliced.structured_content["text"]
    seen["slice_cites_capture"] = any(
        capture_id in item["evidence"] for item in sliced.structured_content["items"]
    )
    resource = await client.read_resource("uprof://profile/alice")
    profile = json.loads(resource.contents[0].text)
    seen["resource_app"] = profile["app_id"]
    bad = await client.call_tool(
        "profile_slice",
        {
            "subject": "alice",
            "query": "q",
            "agent_id": "   ",
            "purpose": "personalization",
            "budget_tokens": 100,
        },
    )
    seen["bad_input"] = error_code(bad) == "invalid_request" and [
        f["field"] for f in json.loads(text_of(bad))["error"]["fields"]
    ] == ["agent_id"]
    forgotten = await client.call_tool("forget", {"subject": "alice"})
    assert not forgotten.is_error, text_of(forgotten)
    seen["forgot"] = len(forgotten.structured_content["withdrawn"])
    item = await client.call_tool("forget", {"subject": "alice", "item_id": "anything"})
    seen["item_erasure_denied"] = error_code(item) == "permission_denied"
    again = await client.call_tool(
        "capture",
        {
            "subject": "alice",
            "agent_id": "agent:one",
            "user_input": "I like jazz",
            "occurred_at": WHEN,
        },
    )
    seen["refused_after_forget"] = error_code(again) == "consent_required"
    return seen


AFTER_CONSENT = {
    "slice_has_cello": True,
    "slice_cites_capture": True,
    "resource_app": PLANNER,
    "bad_input": True,
    "forgot": 1,
    "item_erasure_denied": True,
    "refused_after_forget": True,
}


def test_in_process_server_uses_the_same_gate(kernel: Uprof) -> None:
    runtime = ServiceRuntime.for_kernel(kernel)
    runtime.start()
    server = build_server(runtime, stdio_principal=Principal(PLANNER, "k", frozenset({"app"})))

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with Client(server) as client:
            first = await exercise(client)
            kernel.grant_consent(
                "alice", app_id=PLANNER, categories=["*"], purposes=["personalization"]
            )
            return first, await after_consent(client)

    try:
        first, second = run(scenario)
    finally:
        runtime.stop()
    assert first == {"tools": ["capture", "forget", "profile_slice"], "refused": True}
    assert second == AFTER_CONSENT


def test_server_without_a_principal_fails_closed(kernel: Uprof) -> None:
    server = build_server(ServiceRuntime.for_kernel(kernel))

    async def scenario() -> Any:
        async with Client(server) as client:
            return await client.call_tool(
                "profile_slice",
                {
                    "subject": "alice",
                    "query": "q",
                    "agent_id": "agent:one",
                    "purpose": "personalization",
                    "budget_tokens": 100,
                },
            )

    result = run(scenario)
    assert error_code(result) == "unauthenticated"


def test_streamable_http_authenticates_every_request(kernel: Uprof, keys: ApiKeyStore) -> None:
    runtime = ServiceRuntime.for_kernel(kernel)
    server = build_server(runtime, keys)
    app = server.streamable_http_app(streamable_http_path="/mcp")
    issued = keys.create(PLANNER)
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    runtime.start()

    async def scenario(token: str) -> dict[str, Any]:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http, Client(streamable_http_client(f"{live.url}/mcp", http_client=http)) as c:
            return await after_consent(c)

    try:
        with LiveServer(app) as live:
            anonymous = httpx.post(
                f"{live.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
            )
            assert anonymous.status_code == 401
            assert run(lambda: scenario(issued.token)) == AFTER_CONSENT
            keys.revoke(issued.info.key_id)
            revoked = httpx.post(
                f"{live.url}/mcp",
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                headers={"Authorization": f"Bearer {issued.token}"},
            )
            assert revoked.status_code == 401
    finally:
        runtime.stop()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_stdio_server_takes_its_key_from_the_environment(
    backend: Backend, kernel: Uprof, keys: ApiKeyStore
) -> None:
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    token = keys.create(PLANNER).token
    data_dir = str(kernel.settings.data_dir)

    def params(key: str) -> StdioServerParameters:
        env = {**os.environ, "UPROF_API_KEY": key, "HF_HUB_OFFLINE": "1"}
        return StdioServerParameters(
            command=sys.executable,
            args=[
                "-m",
                "uprof.mcp",
                "--data-dir",
                data_dir,
                "--embedder",
                "hashing",
                "mcp",
                "--transport",
                "stdio",
            ],
            env=env,
        )

    async def scenario() -> dict[str, Any]:
        async with Client(params(token), read_timeout_seconds=60) as client:
            return await after_consent(client)

    seen = run(scenario)
    # The subprocess runs the rule-based extractor, not the test fake: compare what both share.
    assert seen["resource_app"] == PLANNER
    assert seen["slice_cites_capture"] and seen["refused_after_forget"] and seen["bad_input"]


def test_tools_declare_their_effects_and_describe_every_parameter(
    kernel: Uprof, backend: Backend
) -> None:
    runtime = ServiceRuntime.for_kernel(kernel)
    server = build_server(runtime, stdio_principal=Principal(PLANNER, "k", frozenset({"app"})))

    async def scenario() -> Any:
        async with Client(server) as client:
            return (await client.list_tools()).tools

    tools = {t.name: t for t in run(scenario)}
    hints = {
        name: (t.annotations.read_only_hint, t.annotations.destructive_hint)
        for name, t in tools.items()
        if t.annotations is not None
    }
    assert hints == {
        "profile_slice": (True, False),
        "capture": (False, False),
        "forget": (False, True),
    }
    undescribed = [
        (name, param)
        for name, t in tools.items()
        for param, schema in t.input_schema["properties"].items()
        if not schema.get("description")
    ]
    assert undescribed == []
    # The REST defaults: what REST requires is required here too.
    assert {"occurred_at"} <= set(tools["capture"].input_schema["required"])
    assert {"purpose", "budget_tokens"} <= set(tools["profile_slice"].input_schema["required"])


def test_a_bad_argument_gets_the_rest_error_body(kernel: Uprof, backend: Backend) -> None:
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    server = build_server(
        ServiceRuntime.for_kernel(kernel),
        stdio_principal=Principal(PLANNER, "k", frozenset({"app"})),
    )

    async def scenario() -> Any:
        async with Client(server) as client:
            missing = await client.call_tool(
                "capture", {"subject": "alice", "agent_id": "agent:one", "user_input": "I like tea"}
            )
            wrong_type = await client.call_tool(
                "profile_slice",
                {
                    "subject": "alice",
                    "query": "q",
                    "agent_id": "agent:one",
                    "purpose": "personalization",
                    "budget_tokens": "lots",
                },
            )
            typo = await client.call_tool(
                "capture",
                {
                    "subject": "alice",
                    "agent_id": "agent:one",
                    "user_input": "I like tea",
                    "occurred_at": WHEN,
                    "sharing": "sharde",
                },
            )
            return missing, wrong_type, typo

    fields = ("occurred_at", "budget_tokens", "sharing")
    for result, field in zip(run(scenario), fields, strict=True):
        body = json.loads(text_of(result))  # the whole text is the REST body, nothing else
        assert result.is_error
        assert body["error"]["code"] == "invalid_request"
        assert [f["field"] for f in body["error"]["fields"]] == [field]
        assert "pydantic" not in text_of(result)
