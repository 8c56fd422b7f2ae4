"""Review of decision 0130's count of every MCP request (bug FU's fix), attacked as a key
over HTTP (both backends, live server).

Held here, each an attack kept as a test: a tool call is counted once, not once at the
edge and again inside the SDK; a burst sent at once passes exactly as many requests as
the allowance holds; a key over its allowance opens no session and holds no place in the
session cap; a refused request names no session and says nothing of another key.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tests.api.conftest import CALENDAR, PLANNER, LiveServer, bearer
from tests.api.mcp_messages import HELLO, POST_JSON, rpc
from uprof.api import ApiKeyStore
from uprof.api.runtime import ServiceRuntime
from uprof.kernel import Uprof
from uprof.mcp import build_server
from uprof.mcp.server import SessionsPerKeyMiddleware, http_app


def _slice(n: int) -> str:
    arguments = {
        "query": "diet",
        "agent_id": "coach",
        "purpose": "personalization",
        "budget_tokens": 50,
        "subject": "alice",
    }
    return rpc("tools/call", n, {"name": "profile_slice", "arguments": arguments})


def _session(client: httpx.Client, url: str, token: str) -> dict[str, str]:
    own = {**POST_JSON, **bearer(token)}
    opened = client.post(url, json=HELLO, headers=own)
    assert opened.status_code == 200, opened.text[:200]
    session = {**own, "mcp-session-id": opened.headers["mcp-session-id"]}
    done = client.post(url, content=rpc("notifications/initialized"), headers=session)
    assert done.status_code == 202, done.text[:200]
    return session


def test_a_tool_call_costs_one_request_of_the_allowance(kernel: Uprof, keys: ApiKeyStore) -> None:
    """Under ``6/minute``: ``initialize`` and its notification spend 2, then four tool
    calls are served (not two, as a call counted at the edge and again in the SDK would
    be) and the fifth is refused."""
    token = keys.create(PLANNER).token
    runtime = ServiceRuntime.for_kernel(kernel)
    app = http_app(build_server(runtime, keys, rate_limit="6/minute"), path="/mcp")
    runtime.start()
    try:
        with LiveServer(app) as live, httpx.Client(timeout=30) as client:
            url = f"{live.url}/mcp"
            session = _session(client, url, token)
            calls = [client.post(url, content=_slice(10 + i), headers=session) for i in range(5)]
    finally:
        runtime.stop()
    assert [c.status_code for c in calls] == [200, 200, 200, 200, 429]
    for served in calls[:4]:
        assert "rate_limited" not in served.text, served.text[:300]
    assert calls[4].json()["error"]["code"] == "rate_limited"


def test_a_burst_passes_exactly_the_allowance(kernel: Uprof, keys: ApiKeyStore) -> None:
    """24 pings of one session sent at once under ``10/minute`` (2 spent opening it):
    exactly 8 are served, 16 refused; nothing lets a burst through uncounted."""
    token = keys.create(PLANNER).token
    runtime = ServiceRuntime.for_kernel(kernel)
    app = http_app(build_server(runtime, keys, rate_limit="10/minute"), path="/mcp")
    runtime.start()
    try:
        with LiveServer(app) as live, httpx.Client(timeout=30) as client:
            url = f"{live.url}/mcp"
            session = _session(client, url, token)

            def ping(n: int) -> int:
                with httpx.Client(timeout=30) as own:
                    return own.post(url, content=rpc("ping", n), headers=session).status_code

            with ThreadPoolExecutor(max_workers=24) as pool:
                statuses = list(pool.map(ping, range(100, 124)))
    finally:
        runtime.stop()
    assert sorted(statuses) == [200] * 8 + [429] * 16, statuses


def test_a_key_over_its_allowance_opens_no_session_and_holds_no_place(
    kernel: Uprof, keys: ApiKeyStore
) -> None:
    """Under ``1/minute`` with a cap of 2 sessions: the key's one session is opened;
    twelve ``initialize`` sent at once after it are refused ``rate_limited`` (never
    ``too_many_sessions``: they never reached the cap), the SDK holds one session, no
    place is left taken, and the refusal names no session. Another key opens its own."""
    planner = keys.create(PLANNER).token
    calendar = keys.create(CALENDAR).token
    runtime = ServiceRuntime.for_kernel(kernel)
    server = build_server(runtime, keys, rate_limit="1/minute")
    app = http_app(server, path="/mcp", max_sessions_per_key=2)
    runtime.start()
    try:
        with LiveServer(app) as live, httpx.Client(timeout=30) as client:
            url = f"{live.url}/mcp"
            own = {**POST_JSON, **bearer(planner)}
            first = client.post(url, json=HELLO, headers=own)

            def hello(_: int) -> httpx.Response:
                with httpx.Client(timeout=30) as each:
                    return each.post(url, json=HELLO, headers=own)

            with ThreadPoolExecutor(max_workers=12) as pool:
                refused = list(pool.map(hello, range(12)))
            owners = dict(server.session_manager._session_owners)
            places = _opening(app)
            other = client.post(url, json=HELLO, headers={**POST_JSON, **bearer(calendar)})
    finally:
        runtime.stop()
    assert first.status_code == 200, first.text[:200]
    assert [r.status_code for r in refused] == [429] * 12
    assert {r.json()["error"]["code"] for r in refused} == {"rate_limited"}
    assert all("mcp-session-id" not in r.headers for r in refused)
    assert len(owners) == 1
    assert places == {}
    assert other.status_code == 200, other.text[:200]


def _opening(app: Any) -> dict[str, int]:
    """The places held by requests opening sessions (``SessionsPerKeyMiddleware``)."""
    while not isinstance(app, SessionsPerKeyMiddleware):
        app = app.app
    return dict(app._opening)
