"""The MCP SDK's sessionless path goes through the same key, limit and argument checks
(hostile callers, round 5; held, kept as a regression guard; both backends, live server).

Since MCP SDK 2.x a request carrying ``MCP-Protocol-Version: 2026-07-28`` (a revision
without sessions) skips the session manager: no ``initialize``, no ``mcp-session-id``, one
tool call per HTTP request. Tried as a way around what a session carries: it is still
refused without a key (401), a tool call still runs as the key's app, an argument the tool
does not declare is still refused naming it, and ``UPROF_RATE_LIMIT`` still counts each
call (a refused one too, review of 0117) against the key's allowance, nothing done once it
is spent.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.api.conftest import PLANNER, WHEN, LiveServer, bearer
from tests.api.mcp_messages import META, SESSIONLESS_CAPTURE
from uprof.api import ApiKeyStore
from uprof.api.runtime import ServiceRuntime
from uprof.kernel import Uprof
from uprof.mcp import build_server
from uprof.mcp.server import http_app

ARGUMENTS = {"subject": "alice", "agent_id": "agent:one", "occurred_at": WHEN}


def _call(n: int, arguments: dict[str, Any]) -> str:
    params = {"name": "capture", "arguments": arguments, "_meta": META}
    return json.dumps({"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": params})


def _error(response: httpx.Response) -> dict[str, Any] | None:
    result = response.json()["result"]
    if not result.get("isError"):
        return None
    error: dict[str, Any] = json.loads(result["content"][0]["text"])["error"]
    return error


def test_the_sessionless_mcp_path_keeps_the_key_the_limit_and_the_argument_check(
    kernel: Uprof, keys: ApiKeyStore
) -> None:
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    planner = keys.create(PLANNER).token
    runtime = ServiceRuntime.for_kernel(kernel)
    app = http_app(build_server(runtime, keys, rate_limit="2/minute"), path="/mcp")
    runtime.start()
    try:
        with LiveServer(app) as live, httpx.Client(timeout=30) as client:
            url = f"{live.url}/mcp"
            stranger = client.post(
                url,
                content=_call(0, {**ARGUMENTS, "user_input": "hi"}),
                headers=SESSIONLESS_CAPTURE,
            )
            calls = [
                client.post(
                    url,
                    content=_call(n, arguments),
                    headers={**SESSIONLESS_CAPTURE, **bearer(planner)},
                )
                for n, arguments in enumerate(
                    [
                        {**ARGUMENTS, "user_input": "I like tea"},
                        {**ARGUMENTS, "user_input": "I like tea", "app_id": "app:calendar"},
                        {**ARGUMENTS, "user_input": "I like coffee"},
                        {**ARGUMENTS, "user_input": "I like water"},
                    ],
                    1,
                )
            ]
    finally:
        runtime.stop()
    assert stranger.status_code == 401
    # A call refused for its arguments runs no tool but is counted, as REST counts a 422
    # (review of 0117): the allowance of 2 is the first and the second call's. Over it,
    # the request is refused 429 before the SDK reads it, as REST refuses it (bug FU).
    codes = [c.status_code for c in calls]
    assert codes == [200, 200, 429, 429], [c.text[:200] for c in calls]
    first, foreign = (_error(c) for c in calls[:2])
    assert first is None
    assert foreign is not None and foreign["code"] == "invalid_request"
    assert [f["field"] for f in foreign["fields"]] == ["app_id"]
    assert [c.json()["error"]["code"] for c in calls[2:]] == ["rate_limited"] * 2
    accepted = list(kernel.audit_entries(action="capture.accepted"))
    assert len(accepted) == 1  # the refused calls wrote nothing
    assert {e.entry["app_id"] for e in accepted} == {PLANNER}  # as the key's app
