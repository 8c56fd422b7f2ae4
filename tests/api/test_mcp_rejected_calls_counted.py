"""A tool call refused for its arguments counts against the key's rate limit, as a REST
request refused with 422 does (review of 0117; both backends; HTTP with a live server,
and stdio).

``UPROF_RATE_LIMIT`` counted an MCP tool call only once its tool ran: a call the SDK
refused for its arguments (a required one missing, a wrong type) or one refused for an
argument the tool does not declare was never counted. A key over its allowance, or an
agent stuck in a loop of malformed calls (the usual way an agent goes wrong), was never
slowed over MCP, where REST answers 429 for the same key. Now every tool call and resource
read counts, before its arguments are looked at.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from mcp import Client as McpClient
from mcp.shared.exceptions import MCPError

from tests.api.conftest import PLANNER, WHEN, LiveServer, bearer
from tests.api.mcp_messages import META, SESSIONLESS_CAPTURE
from uprof.api import ApiKeyStore
from uprof.api.runtime import ServiceRuntime
from uprof.apikeys.store import Principal
from uprof.kernel import Uprof
from uprof.mcp import build_server
from uprof.mcp.server import http_app

GOOD = {"subject": "alice", "agent_id": "agent:one", "occurred_at": WHEN, "user_input": "tea"}
# Refused by the SDK (a required argument missing), and by uprof (an undeclared one).
MISSING = {k: v for k, v in GOOD.items() if k != "occurred_at"}
UNDECLARED = {**GOOD, "app_id": "app:calendar"}


def _call(n: int, arguments: dict[str, Any]) -> str:
    params = {"name": "capture", "arguments": arguments, "_meta": META}
    return json.dumps({"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": params})


def _code(result: dict[str, Any]) -> str | None:
    if not result.get("isError"):
        return None
    return str(json.loads(result["content"][0]["text"])["error"]["code"])


def test_tool_calls_refused_for_their_arguments_count_over_http(
    kernel: Uprof, keys: ApiKeyStore
) -> None:
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    planner = keys.create(PLANNER).token
    runtime = ServiceRuntime.for_kernel(kernel)
    app = http_app(build_server(runtime, keys, rate_limit="2/minute"), path="/mcp")
    runtime.start()
    try:
        with LiveServer(app) as live, httpx.Client(timeout=30) as client:
            answers = [
                client.post(
                    f"{live.url}/mcp",
                    content=_call(n, arguments),
                    headers={**SESSIONLESS_CAPTURE, **bearer(planner)},
                )
                for n, arguments in enumerate([MISSING, UNDECLARED, GOOD], 1)
            ]
    finally:
        runtime.stop()
    # Over HTTP the call over the allowance is refused before the SDK reads it, as REST
    # refuses it (429, ``Retry-After``): every request of a key is counted there (bug FU).
    assert [a.status_code for a in answers] == [200, 200, 429], [a.text[:200] for a in answers]
    codes = [_code(a.json()["result"]) for a in answers[:2]]
    assert codes == ["invalid_request", "invalid_request"], codes
    assert answers[2].json()["error"]["code"] == "rate_limited"
    assert list(kernel.audit_entries(action="capture.accepted")) == []


def test_tool_calls_refused_for_their_arguments_count_over_stdio(kernel: Uprof) -> None:
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    runtime = ServiceRuntime.for_kernel(kernel)
    server = build_server(
        runtime, stdio_principal=Principal(PLANNER, "k", frozenset({"app"})), rate_limit="2/minute"
    )

    async def calls() -> list[Any]:
        async with McpClient(server) as client:
            return [await client.call_tool("capture", a) for a in (MISSING, UNDECLARED, GOOD)]

    runtime.start()
    try:
        results = asyncio.run(calls())
    finally:
        runtime.stop()
    codes = [
        json.loads(r.content[0].text)["error"]["code"] if r.is_error else None for r in results
    ]
    assert codes == ["invalid_request", "invalid_request", "rate_limited"], codes
    assert list(kernel.audit_entries(action="capture.accepted")) == []


def test_resource_reads_count_a_refused_one_too(kernel: Uprof) -> None:
    """A read of a URI no resource matches is refused by the SDK before the resource runs;
    it counts as a request too, and reads of the profile go on counting."""
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    runtime = ServiceRuntime.for_kernel(kernel)
    server = build_server(
        runtime, stdio_principal=Principal(PLANNER, "k", frozenset({"app"})), rate_limit="2/minute"
    )

    async def reads() -> list[str]:
        outcomes = []
        async with McpClient(server) as client:
            for uri in ("uprof://nothing/alice", "uprof://profile/alice", "uprof://profile/alice"):
                try:
                    await client.read_resource(uri)
                    outcomes.append("served")
                except MCPError as refused:
                    outcomes.append(refused.error.message)
        return outcomes

    runtime.start()
    try:
        unknown, first, over = asyncio.run(reads())
    finally:
        runtime.stop()
    assert unknown != "served" and "rate_limited" not in unknown, unknown
    assert first == "served"
    assert over != "served", "a third read was served within an allowance of 2"
    assert json.loads(over)["error"]["code"] == "rate_limited", over
