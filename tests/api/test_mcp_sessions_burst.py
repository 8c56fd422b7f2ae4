"""A burst of one key's ``initialize`` requests cannot open more sessions than its cap
(review of 0117; both backends, a live server and several real client processes).

Decision 0117 capped a key's open MCP sessions (bug BP) by counting the SDK's record of
who opened each, and left "several ``initialize`` of one key at the same moment may each
pass the count once". That moment is long: the count is read before the SDK's bearer
check (a key read in a worker thread) and before the SDK registers the session, so every
request of a burst sent together passed the count while none was registered yet, and a
key could open as many sessions as it could send requests at once, the cap no bound at
all (found in review: 60 sent together by 3 processes opened 60 sessions with a cap of 5).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from tests.api.conftest import PLANNER, LiveServer
from tests.api.mcp_messages import ACCEPT, HELLO, META, MODERN
from uprof.api import ApiKeyStore
from uprof.api.runtime import ServiceRuntime
from uprof.kernel import Uprof
from uprof.mcp import build_server
from uprof.mcp.server import http_app

CLIENT = Path(__file__).with_name("mcp_burst_client.py")
CAP = 5
PROCESSES = 3
EACH = 20


def test_a_burst_of_initialize_requests_opens_no_more_sessions_than_the_cap(
    kernel: Uprof, keys: ApiKeyStore
) -> None:
    hog = keys.create(PLANNER).token
    runtime = ServiceRuntime.for_kernel(kernel)
    server = build_server(runtime, keys)
    app = http_app(server, path="/mcp", max_sessions_per_key=CAP)
    runtime.start()
    try:
        with LiveServer(app) as live:
            url = f"{live.url}/mcp"
            # Several real processes, each sending its requests together.
            clients = [
                subprocess.Popen(
                    [sys.executable, str(CLIENT), url, hog, str(EACH)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for _ in range(PROCESSES)
            ]
            answers = [json.loads(c.communicate(timeout=120)[0]) for c in clients]
            held = len(server.session_manager._session_owners)
    finally:
        runtime.stop()
    statuses: dict[str, int] = {}
    for answer in answers:
        for status, count in answer.items():
            statuses[status] = statuses.get(status, 0) + count
    assert sum(statuses.values()) == PROCESSES * EACH, statuses
    assert set(statuses) <= {"200", "429"}, statuses
    assert statuses.get("200", 0) <= CAP, statuses
    assert held <= CAP, (held, statuses)
    assert statuses.get("429", 0) >= PROCESSES * EACH - CAP, statuses


MODERN_LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": META}}


def test_no_request_of_a_key_at_its_cap_opens_a_session_and_sessionless_ones_are_served(
    kernel: Uprof, keys: ApiKeyStore
) -> None:
    """Held, as attacks: a key at its cap opens no session by sending ``initialize`` with
    a bogus or empty ``mcp-session-id`` (404), by GET or DELETE without one (400), or
    by spelling the bearer scheme otherwise (the cap reads the key as the SDK does: 429).
    Fixed with the burst: the sessionless path (a ``MCP-Protocol-Version`` of a revision
    without sessions) opens none, and was refused ``too_many_sessions`` for sessions it
    does not open; a request of it no longer holds a place in the count either."""
    token = keys.create(PLANNER).token
    runtime = ServiceRuntime.for_kernel(kernel)
    server = build_server(runtime, keys)
    app = http_app(server, path="/mcp", max_sessions_per_key=1)
    owners = server.session_manager._session_owners
    runtime.start()
    try:
        with LiveServer(app) as live, httpx.Client(timeout=30) as client:
            url = f"{live.url}/mcp"
            key = {**ACCEPT, "Authorization": f"Bearer {token}"}
            first = client.post(url, json=HELLO, headers=key)
            attacks = {
                "bogus id": client.post(url, json=HELLO, headers={**key, "Mcp-Session-Id": "x"}),
                "empty id": client.post(url, json=HELLO, headers={**key, "Mcp-Session-Id": ""}),
                "GET": client.get(url, headers=key),
                "DELETE": client.delete(url, headers=key),
                "scheme": client.post(
                    url, json=HELLO, headers={**ACCEPT, "AUTHORIZATION": f"bEaReR   {token}"}
                ),
                "handshake version": client.post(
                    url, json=HELLO, headers={**key, "MCP-Protocol-Version": "2025-06-18"}
                ),
                "modern initialize": client.post(
                    url, json=HELLO, headers={**key, "MCP-Protocol-Version": MODERN}
                ),
            }
            held = len(owners)
            modern = client.post(
                url,
                json=MODERN_LIST,
                headers={**key, "MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/list"},
            )
    finally:
        runtime.stop()
    assert first.status_code == 200, first.text[:300]
    statuses = {name: answer.status_code for name, answer in attacks.items()}
    assert statuses["bogus id"] == statuses["empty id"] == 404, statuses
    assert statuses["GET"] == statuses["DELETE"] == 400, statuses
    assert statuses["scheme"] == statuses["handshake version"] == 429, statuses
    assert (
        statuses["modern initialize"] != 200
        or "mcp-session-id" not in attacks["modern initialize"].headers
    ), attacks["modern initialize"].text[:300]
    assert held == 1, (held, statuses)
    assert modern.status_code == 200 and "profile_slice" in modern.text, modern.text[:300]
