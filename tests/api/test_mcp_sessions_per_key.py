"""One API key cannot take every MCP session of a server (hostile callers, round 5).

The MCP SDK keeps at most ``max_sessions`` (10,000) stateful sessions per server process,
each one open until it is deleted or idle for 30 minutes, and refuses every new one with
503 "Too many open sessions" while that many are open: for every app and every tenant of
the server. Opening a session (``initialize``) runs no tool, so ``UPROF_RATE_LIMIT`` never
counted it. One app's key could open sessions until no other app could start one (found
in review: the 10,001st ``initialize`` of any key was refused, whoever had opened the
others). A key now holds at most ``max_sessions_per_key`` sessions at once; its next
``initialize`` is refused (429 ``too_many_sessions``) and other keys open theirs.
"""

from __future__ import annotations

import json

import httpx

from tests.api.conftest import PLANNER, LiveServer, bearer
from tests.api.mcp_messages import ACCEPT, HELLO
from uprof.api import ApiKeyStore
from uprof.api.runtime import ServiceRuntime
from uprof.kernel import Uprof
from uprof.mcp import build_server
from uprof.mcp.server import DEFAULT_MAX_SESSIONS_PER_KEY, http_app

OTHER = "app:other"


def _open(client: httpx.Client, url: str, token: str) -> httpx.Response:
    return client.post(f"{url}/mcp", json=HELLO, headers={**ACCEPT, **bearer(token)})


def test_one_key_cannot_take_every_mcp_session(kernel: Uprof, keys: ApiKeyStore) -> None:
    hog = keys.create(PLANNER).token
    other = keys.create(OTHER).token
    runtime = ServiceRuntime.for_kernel(kernel)
    server = build_server(runtime, keys)
    app = http_app(server, path="/mcp")
    # The SDK's own limit, lowered so the test needs a few sessions, not 10,000; one key
    # may hold more sessions than this server has room for only if nothing stops it.
    server.session_manager.max_sessions = DEFAULT_MAX_SESSIONS_PER_KEY + 2
    runtime.start()
    try:
        with LiveServer(app) as live, httpx.Client(timeout=30) as client:
            # The hog asks for every session the server has room for.
            tries = [_open(client, live.url, hog) for _ in range(DEFAULT_MAX_SESSIONS_PER_KEY + 2)]
            opened, refused = tries[:DEFAULT_MAX_SESSIONS_PER_KEY], tries[-2:]
            theirs = _open(client, live.url, other)
            # Closing one of its sessions gives the key room again.
            ended = client.delete(
                f"{live.url}/mcp",
                headers={
                    **ACCEPT,
                    **bearer(hog),
                    "mcp-session-id": opened[0].headers["mcp-session-id"],
                },
            )
            again = _open(client, live.url, hog)
    finally:
        runtime.stop()
    assert theirs.status_code == 200, theirs.text[:300]
    assert all(r.status_code == 200 for r in opened), [r.status_code for r in opened]
    assert [r.status_code for r in refused] == [429, 429], refused[0].text[:300]
    error = json.loads(refused[0].text)["error"]
    assert error["code"] == "too_many_sessions"
    assert str(DEFAULT_MAX_SESSIONS_PER_KEY) in error["message"]
    assert ended.status_code in (200, 204), ended.text[:300]
    assert again.status_code == 200, again.text[:300]


def test_another_key_can_neither_use_nor_end_a_keys_session(
    kernel: Uprof, keys: ApiKeyStore
) -> None:
    """Held: a session belongs to the key that opened it (the SDK compares the key id our
    token verifier gives); another key, of another app or of the same app, that learns its
    id gets 404 as for no session, and the session goes on serving its own key."""
    owner = keys.create(PLANNER).token
    strangers = [keys.create(OTHER).token, keys.create(PLANNER).token]
    runtime = ServiceRuntime.for_kernel(kernel)
    app = http_app(build_server(runtime, keys), path="/mcp")
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    runtime.start()
    try:
        with LiveServer(app) as live, httpx.Client(timeout=30) as client:
            session = {"mcp-session-id": _open(client, live.url, owner).headers["mcp-session-id"]}
            used = [
                client.post(
                    f"{live.url}/mcp", json=listing, headers={**ACCEPT, **bearer(t), **session}
                )
                for t in strangers
            ]
            ended = [
                client.delete(f"{live.url}/mcp", headers={**ACCEPT, **bearer(t), **session})
                for t in strangers
            ]
            still = client.post(
                f"{live.url}/mcp", json=listing, headers={**ACCEPT, **bearer(owner), **session}
            )
    finally:
        runtime.stop()
    assert [r.status_code for r in used + ended] == [404] * 4, [r.text[:200] for r in used]
    assert still.status_code == 200 and "profile_slice" in still.text, still.text[:300]
