"""A key over its rate limit may still end its own MCP sessions (hostile callers round 7,
bug HI; both backends, live server).

Since round 6 (bug FU) every MCP request of a key counts against its allowance, a DELETE
too. A key over its allowance could therefore not end its sessions: they stayed in the
per-key session cap (and in the SDK's server-wide table) until their 30-minute idle
timeout, and a client that wanted to give its sessions back when told to slow down (what
the 429's own hint, "end one you no longer use", asks) was refused 429 for doing so.

Ending a session only gives back what the key holds, so a DELETE of a session the key
itself opened and still holds is served without being counted; any other DELETE (an
unknown id, a session already ended, another key's session) is counted as before, so the
exemption buys at most one uncounted request per session the key opened (a burst of
DELETEs of one session passes one, the rest are counted).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.api.conftest import CALENDAR, PLANNER, LiveServer, bearer
from tests.api.mcp_messages import HELLO, POST_JSON, rpc
from uprof.api import ApiKeyStore
from uprof.api.runtime import ServiceRuntime
from uprof.kernel import Uprof
from uprof.mcp import build_server
from uprof.mcp.server import http_app


def _open(client: httpx.Client, url: str, own: dict[str, str]) -> dict[str, str]:
    opened = client.post(url, json=HELLO, headers=own)
    assert opened.status_code == 200, opened.text[:200]
    session = {**own, "mcp-session-id": opened.headers["mcp-session-id"]}
    done = client.post(url, content=rpc("notifications/initialized"), headers=session)
    assert done.status_code == 202, done.text[:200]
    return session


def test_a_key_over_its_allowance_ends_its_own_sessions_and_nothing_else(
    kernel: Uprof, keys: ApiKeyStore
) -> None:
    """``5/minute``, cap 2: the planner opens two sessions (4 requests) and pings (5).
    Over its allowance: a ping is refused; a DELETE of its first session is served and
    the SDK forgets the session; the same DELETE again, and one of a made-up id, are
    counted and refused. Twelve DELETEs of its second session sent at once end it once:
    one is served, eleven refused. Another key, over its own allowance, sending a DELETE of
    a session the planner holds is refused 429 and the session stays."""
    planner = keys.create(PLANNER).token
    calendar = keys.create(CALENDAR).token
    runtime = ServiceRuntime.for_kernel(kernel)
    server = build_server(runtime, keys, rate_limit="5/minute")
    app = http_app(server, path="/mcp", max_sessions_per_key=2)
    owners = server.session_manager._session_owners
    runtime.start()
    try:
        with LiveServer(app) as live, httpx.Client(timeout=30) as client:
            url = f"{live.url}/mcp"
            own = {**POST_JSON, **bearer(planner)}
            first, second = _open(client, url, own), _open(client, url, own)
            pinged = client.post(url, content=rpc("ping", 2), headers=first)  # 5 of 5
            over = client.post(url, content=rpc("ping", 3), headers=first)

            # The calendar spends its allowance and tries to end the planner's session.
            theirs = {**POST_JSON, **bearer(calendar)}
            spent = [client.post(url, content=rpc("ping", 9), headers=theirs) for _ in range(5)]
            foreign = client.delete(
                url, headers={**theirs, "mcp-session-id": second["mcp-session-id"]}
            )
            second_after_foreign = second["mcp-session-id"] in owners

            ended = client.delete(url, headers=first)
            first_after = first["mcp-session-id"] in owners
            again = client.delete(url, headers=first)
            made_up = client.delete(url, headers={**own, "mcp-session-id": "0" * 32})

            def end(_: int) -> httpx.Response:
                with httpx.Client(timeout=30) as each:
                    return each.delete(url, headers=second)

            with ThreadPoolExecutor(max_workers=12) as pool:
                burst = list(pool.map(end, range(12)))
            left = dict(owners)
    finally:
        runtime.stop()
    assert pinged.status_code == 200, pinged.text[:200]
    assert over.status_code == 429, over.text[:200]
    assert len(spent) == 5
    assert foreign.status_code == 429, foreign.text[:200]
    assert foreign.json()["error"]["code"] == "rate_limited"
    assert second_after_foreign, "another key's refused DELETE must not end the session"

    assert ended.status_code == 200, ended.text[:200]
    assert not first_after, "the SDK still holds the session its owner ended"
    for refused in (again, made_up):
        assert refused.status_code == 429, refused.text[:200]
        assert refused.json()["error"]["code"] == "rate_limited"
    statuses = sorted(r.status_code for r in burst)
    assert statuses == [200] + [429] * 11, statuses
    assert left == {}, "every session of the planner is ended"
