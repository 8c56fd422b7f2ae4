"""Bodies at the edge of the size limit over MCP (review of 0138; held; both backends,
live server).

Round 7 (bug HK) made the size limit answer a streamed body over it in the REST error
form on every surface. Tried here against that change: a streamed (chunked) body of
exactly the limit is served whole, one byte more is refused 413 ``payload_too_large``,
and a gzip-compressed body (``Content-Encoding: gzip``) whose JSON is many times the
limit is not expanded by anything on the way (no middleware decodes request bodies):
the SDK reads the bytes as sent and refuses them as not JSON, nothing is written, and
the session serves the next request.
"""

from __future__ import annotations

import gzip
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

LIMIT = 8_000


def _chunks(body: bytes) -> Iterator[bytes]:
    for start in range(0, len(body), 1000):
        yield body[start : start + 1000]


def _padded(text: str, size: int) -> bytes:
    """The JSON text with blanks after it, ``size`` bytes in all (still one JSON value)."""
    body = text.encode()
    assert len(body) <= size
    return body + b" " * (size - len(body))


def test_bodies_at_the_limit_and_compressed_bodies_over_mcp(
    kernel: Uprof, keys: ApiKeyStore
) -> None:
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    planner = keys.create(PLANNER).token
    runtime = ServiceRuntime.for_kernel(kernel)
    app = http_app(build_server(runtime, keys), path="/mcp", max_body_bytes=LIMIT)
    arguments = {"subject": "alice", "agent_id": "agent:one", "occurred_at": WHEN}
    capture = rpc(
        "tools/call",
        4,
        {"name": "capture", "arguments": {**arguments, "user_input": "x" * 200_000}},
    )
    squeezed = gzip.compress(capture.encode())
    assert len(squeezed) < LIMIT < len(capture)
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
            before = kernel.lag().log_position
            at_limit = client.post(
                url, content=_chunks(_padded(rpc("ping", 2), LIMIT)), headers=session
            )
            over = client.post(
                url, content=_chunks(_padded(rpc("ping", 3), LIMIT + 1)), headers=session
            )
            compressed = client.post(
                url, content=squeezed, headers={**session, "Content-Encoding": "gzip"}
            )
            after = kernel.lag().log_position
            ping = client.post(url, content=rpc("ping", 5), headers=session)
    finally:
        runtime.stop()
    assert at_limit.status_code == 200, at_limit.text[:200]
    assert over.status_code == 413, over.text[:200]
    assert json.loads(over.text)["error"]["code"] == "payload_too_large"
    assert compressed.status_code == 400, compressed.text[:200]
    assert "result" not in compressed.text
    assert after == before, "nothing is written for these bodies"
    assert ping.status_code == 200, ping.text[:200]
