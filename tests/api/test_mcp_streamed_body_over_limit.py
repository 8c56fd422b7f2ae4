"""A body sent without ``Content-Length`` (chunked) that grows past the limit is refused
over MCP in the REST error form (hostile callers round 7, bug HK; both backends, live
server).

The size limit refuses a declared length over the limit before reading (413, the REST
error body, ``payload_too_large``), and a streamed body once it has read past the limit,
by raising from ``receive``. Under the REST app FastAPI turns that into the JSON error;
under MCP the SDK's Starlette app answered it as ``text/plain`` ("request body exceeds
64000 bytes"), so a client reading the error form (``error.code``) got a body it could
not parse, and a different answer for the same refusal depending on how its HTTP library
sent the body. Now the limit answers both the same way, on every surface.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx

from tests.api.conftest import PLANNER, WHEN, LiveServer, bearer
from tests.api.mcp_messages import ACCEPT, HELLO, POST_JSON, rpc
from uprof.api import ApiKeyStore
from uprof.api.runtime import ServiceRuntime
from uprof.kernel import Uprof
from uprof.mcp import build_server
from uprof.mcp.server import http_app


def _chunks(body: bytes) -> Iterator[bytes]:
    for start in range(0, len(body), 8192):
        yield body[start : start + 8192]


def test_a_streamed_mcp_body_over_the_limit_gets_the_rest_error(
    kernel: Uprof, keys: ApiKeyStore
) -> None:
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    planner = keys.create(PLANNER).token
    runtime = ServiceRuntime.for_kernel(kernel)
    app = http_app(build_server(runtime, keys), path="/mcp", max_body_bytes=64_000)
    arguments = {"subject": "alice", "agent_id": "agent:one", "occurred_at": WHEN}
    call = rpc(
        "tools/call",
        2,
        {"name": "capture", "arguments": {**arguments, "user_input": "x" * 400_000}},
    )
    before = kernel.lag().log_position
    runtime.start()
    try:
        with LiveServer(app) as live, httpx.Client(timeout=30) as client:
            url = f"{live.url}/mcp"
            opened = client.post(url, json=HELLO, headers={**ACCEPT, **bearer(planner)})
            assert opened.status_code == 200, opened.text[:200]
            session = {
                **POST_JSON,
                **bearer(planner),
                "mcp-session-id": opened.headers["mcp-session-id"],
            }
            huge = client.post(url, content=_chunks(call.encode()), headers=session)
            after_huge = kernel.lag().log_position
            ping = client.post(url, content=rpc("ping", 3), headers=session)
    finally:
        runtime.stop()
    assert huge.status_code == 413, huge.text[:300]
    assert huge.headers["content-type"].startswith("application/json"), huge.headers
    assert json.loads(huge.text)["error"]["code"] == "payload_too_large"
    assert after_huge == before  # nothing written for the refused body
    assert ping.status_code == 200, ping.text[:200]
