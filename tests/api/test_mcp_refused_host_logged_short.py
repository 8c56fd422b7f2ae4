"""A request the MCP SDK refuses for its ``Host`` or ``Origin`` header is logged without
the header's value (hostile callers round 6, bug FW; both backends, live server).

The SDK's DNS-rebinding check (on for a server bound to a loopback address, as ``uprof
mcp`` is by default) logs each refused request at WARNING with the header whole. Any valid
key could send an 8 KB ``Host``: 25 KB of log per request, and rendering the line held
the server's event loop, so every other app's requests waited (measured with a real
``uprof mcp`` and no rate limit, two such clients: another key's median answer went from
2 ms to 3.5 s, the slowest 5.5 s). The line now names the header, not its value.
"""

from __future__ import annotations

import logging
import socket

import httpx
import pytest

from tests.api.conftest import PLANNER, LiveServer, bearer
from tests.api.mcp_messages import POST_JSON
from uprof.api import ApiKeyStore
from uprof.api.runtime import ServiceRuntime
from uprof.kernel import Uprof
from uprof.mcp import build_server
from uprof.mcp.server import http_app

PING = '{"jsonrpc": "2.0", "id": 1, "method": "ping"}'
FORGED = "evil-" + "A" * 8000


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_forged_host_or_origin_is_not_written_to_the_log(
    kernel: Uprof, keys: ApiKeyStore
) -> None:
    planner = keys.create(PLANNER).token
    runtime = ServiceRuntime.for_kernel(kernel)
    app = http_app(build_server(runtime, keys), path="/mcp")
    kept = _Kept()
    logger = logging.getLogger("mcp.server.transport_security")
    logger.addHandler(kept)
    runtime.start()
    try:
        with LiveServer(app) as live, httpx.Client(timeout=30) as client:
            url = f"{live.url}/mcp"
            own = {**POST_JSON, **bearer(planner)}
            refused = [
                client.post(url, content=PING, headers={**own, "Host": FORGED}),
                client.post(url, content=PING, headers={**own, "Origin": f"http://{FORGED}"}),
            ]
    finally:
        runtime.stop()
        logger.removeHandler(kept)
    assert [r.status_code for r in refused] == [421, 403], [r.text[:100] for r in refused]
    assert len(kept.lines) == 2, kept.lines
    for line in kept.lines:
        assert "evil" not in line and len(line) < 100, line[:200]
    assert "Host" in kept.lines[0] and "Origin" in kept.lines[1], kept.lines


@pytest.fixture(autouse=True)
def _sdk_logs_warnings() -> None:
    logging.getLogger("mcp.server.transport_security").setLevel(logging.WARNING)


def test_a_request_without_host_and_other_records_are_not_logged_as_a_refused_host(
    kernel: Uprof, keys: ApiKeyStore
) -> None:
    """Review of 0130 (bug GF): the filter rewrote every record of the SDK's logger into
    "its Host header is not allowed". A request with no ``Host`` at all (HTTP/1.0) was
    logged as one whose ``Host`` was refused, and any other record of that logger (a
    newer SDK's) would have been too, its own text lost. A missing header is named as
    missing; a record the filter does not know keeps its text, cut short."""
    planner = keys.create(PLANNER).token
    runtime = ServiceRuntime.for_kernel(kernel)
    app = http_app(build_server(runtime, keys), path="/mcp")
    kept = _Kept()
    logger = logging.getLogger("mcp.server.transport_security")
    logger.addHandler(kept)
    runtime.start()
    try:
        with LiveServer(app) as live:
            request = (
                f"POST /mcp HTTP/1.0\r\nAuthorization: Bearer {planner}\r\n"
                "Accept: application/json, text/event-stream\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(PING)}\r\n\r\n{PING}"
            )
            with socket.create_connection(("127.0.0.1", live.port), timeout=30) as s:
                s.sendall(request.encode())
                status = s.recv(4096).split(b"\r\n", 1)[0]
        logger.warning("Request body too large: %s", "B" * 8000)
    finally:
        runtime.stop()
        logger.removeHandler(kept)
    assert b" 421 " in status or b" 400 " in status, status
    assert len(kept.lines) == 2, kept.lines
    missing, other = kept.lines
    assert "no Host header" in missing and "not allowed" not in missing, missing
    assert other.startswith("Request body too large") and len(other) < 300, other[:300]
