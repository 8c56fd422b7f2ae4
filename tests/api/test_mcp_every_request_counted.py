"""Every MCP request over HTTP counts against the key's rate limit, whatever it asks
(hostile callers round 6, bug FU; both backends, live server).

``UPROF_RATE_LIMIT`` counted an MCP request only when it was a tool call or a resource
read. A key over its allowance was still served ``initialize``, ``ping``, ``tools/list``,
notifications, the sessionless path's listings and a GET stream, without limit (measured
with a real ``uprof mcp`` under ``2/minute``: 590 to 2,000 requests/s each), and two of
them write the server's log: a malformed notification 162 bytes a request (630/s), a
request with a forged ``Host`` header the header whole, 12.5 KB a request for a 4 KB
header. REST counts every authenticated request, a refused one included; MCP over HTTP now
does too, before the SDK sees the request. A stranger without a key is refused 401 and
spends nothing of the app's allowance.
"""

from __future__ import annotations

import httpx

from tests.api.conftest import CALENDAR, PLANNER, LiveServer, bearer
from tests.api.mcp_messages import HELLO, META, MODERN, POST_JSON, rpc
from uprof.api import ApiKeyStore
from uprof.api.runtime import ServiceRuntime
from uprof.kernel import Uprof
from uprof.mcp import build_server
from uprof.mcp.server import http_app


def test_every_mcp_request_of_a_key_counts_against_its_limit(
    kernel: Uprof, keys: ApiKeyStore
) -> None:
    planner = keys.create(PLANNER).token
    calendar = keys.create(CALENDAR).token
    runtime = ServiceRuntime.for_kernel(kernel)
    app = http_app(build_server(runtime, keys, rate_limit="3/minute"), path="/mcp")
    runtime.start()
    try:
        with LiveServer(app) as live, httpx.Client(timeout=30) as client:
            url = f"{live.url}/mcp"
            own = {**POST_JSON, **bearer(planner)}
            # A stranger's requests are refused and spend nothing of the app's allowance.
            strangers = [client.post(url, json=HELLO, headers=POST_JSON) for _ in range(3)]
            strangers += [
                client.post(url, json=HELLO, headers={**POST_JSON, **bearer("uprof_forged")})
                for _ in range(3)
            ]
            opened = client.post(url, json=HELLO, headers=own)  # 1
            session = {**own, "mcp-session-id": opened.headers.get("mcp-session-id", "")}
            initialized = client.post(  # 2
                url, content=rpc("notifications/initialized"), headers=session
            )
            listed = client.post(url, content=rpc("tools/list", 2), headers=session)  # 3
            # The allowance is spent: whatever the key asks now is refused, nothing done.
            over = {
                "ping": client.post(url, content=rpc("ping", 3), headers=session),
                "tools/list": client.post(url, content=rpc("tools/list", 4), headers=session),
                "initialize": client.post(url, json=HELLO, headers=own),
                "notification": client.post(
                    url,
                    content=rpc("notifications/cancelled", None, {"requestId": {"x": 1}}),
                    headers=session,
                ),
                "sessionless tools/list": client.post(
                    url,
                    content=rpc("tools/list", 5, {"_meta": META}),
                    headers={**own, "MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/list"},
                ),
                "forged Host": client.post(
                    url, content=rpc("ping", 6), headers={**session, "Host": "evil.example"}
                ),
                # Ending its own session is not counted (round 7, bug HI:
                # test_mcp_over_limit_ends_sessions.py); a DELETE of any other id is.
                "DELETE": client.delete(url, headers={**session, "mcp-session-id": "0" * 32}),
            }
            # Another app's key has its own allowance.
            other = client.post(url, json=HELLO, headers={**POST_JSON, **bearer(calendar)})
    finally:
        runtime.stop()
    assert [s.status_code for s in strangers] == [401] * 6
    assert opened.status_code == 200, opened.text[:200]
    assert initialized.status_code == 202, initialized.text[:200]
    assert listed.status_code == 200, listed.text[:200]
    refused = {name: r.status_code for name, r in over.items()}
    assert refused == dict.fromkeys(over, 429), refused
    for name, r in over.items():
        assert r.json()["error"]["code"] == "rate_limited", (name, r.text[:200])
        assert int(r.headers["Retry-After"]) >= 1, name
    assert other.status_code == 200, other.text[:200]
