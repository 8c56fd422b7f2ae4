"""MCP over streamable HTTP keeps the REST API's limits: the request body size and the
rate limit per API key.

Found in a hostile-caller review (2026-12-05): ``uprof mcp --transport http`` served
``streamable_http_app`` as the MCP SDK builds it, so an app's key could post a body of any
size (the SDK reads it whole into memory before parsing; a 4 MB call was read and parsed
on the code before the fix, where REST refuses anything over ``--max-body-bytes`` with 413
before reading it), and ``UPROF_RATE_LIMIT``, which ``uprof serve`` enforces per key, was
not applied: the same key was limited over REST and unlimited over MCP.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from mcp import Client as McpClient

from tests.api.conftest import PLANNER, WHEN, LiveServer, bearer
from tests.api.mcp_messages import ACCEPT, HELLO
from uprof.api import ApiKeyStore
from uprof.api.runtime import ServiceRuntime
from uprof.apikeys.store import Principal
from uprof.kernel import Uprof
from uprof.mcp import build_server
from uprof.mcp.server import http_app


def _capture_call(text: str) -> dict[str, Any]:
    arguments = {"subject": "alice", "agent_id": "agent:one", "user_input": text}
    return {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "capture", "arguments": {**arguments, "occurred_at": WHEN}},
    }


def test_an_mcp_body_over_the_limit_is_413_before_it_is_read(
    kernel: Uprof, keys: ApiKeyStore
) -> None:
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    planner = keys.create(PLANNER).token
    runtime = ServiceRuntime.for_kernel(kernel)
    app = http_app(build_server(runtime, keys), path="/mcp", max_body_bytes=64_000)
    before = kernel.lag().log_position
    runtime.start()
    try:
        with LiveServer(app) as live:
            opened = httpx.post(
                f"{live.url}/mcp", json=HELLO, headers={**ACCEPT, **bearer(planner)}
            )
            assert opened.status_code == 200, opened.text
            session = {"mcp-session-id": opened.headers["mcp-session-id"]}
            headers = {**ACCEPT, **bearer(planner), **session}
            huge = httpx.post(
                f"{live.url}/mcp", json=_capture_call("x" * 4_000_000), headers=headers
            )
            after_huge = kernel.lag().log_position
            small = httpx.post(f"{live.url}/mcp", json=_capture_call("I like tea"), headers=headers)
    finally:
        runtime.stop()
    assert huge.status_code == 413, huge.text[:300]
    assert json.loads(huge.text)["error"]["code"] == "payload_too_large"
    assert small.status_code == 200 and "capture_id" in small.text, small.text[:300]
    assert after_huge == before  # nothing written for the refused body


def test_an_mcp_key_over_its_rate_limit_is_refused_and_writes_nothing(kernel: Uprof) -> None:
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    runtime = ServiceRuntime.for_kernel(kernel)
    server = build_server(
        runtime, stdio_principal=Principal(PLANNER, "k", frozenset({"app"})), rate_limit="2/minute"
    )
    arguments = {"subject": "alice", "agent_id": "agent:one", "occurred_at": WHEN}

    async def calls() -> list[Any]:
        results = []
        async with McpClient(server) as client:
            for n in range(3):
                tea = {**arguments, "user_input": f"I like tea {n}"}
                results.append(await client.call_tool("capture", tea))
        return results

    runtime.start()
    try:
        first, second, third = asyncio.run(calls())
    finally:
        runtime.stop()
    assert not first.is_error and not second.is_error
    assert third.is_error
    error = json.loads(" ".join(getattr(b, "text", "") for b in third.content))["error"]
    assert error["code"] == "rate_limited"
    accepted = list(kernel.audit_entries(action="capture.accepted"))
    assert len(accepted) == 2  # the refused capture wrote nothing
