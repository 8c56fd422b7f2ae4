"""``uprof mcp --max-sessions-per-key``: the operator sets a key's cap of open MCP
sessions (review of 0117; both backends, ``uprof mcp`` as a real process).

Decision 0117 (bug BP) capped a key at 100 open sessions, a constant of ``http_app``: a
deployment whose app serves more than 100 conversations at once through one key (an MCP
client keeps a session per conversation), or whose clients lose their sessions without
ending them (each then held 30 minutes), was refused 429 ``too_many_sessions`` with no way
to raise the cap short of changing the code.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx

from tests.api.conftest import PLANNER, bearer
from tests.conftest import Backend
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof

ACCEPT = {"Accept": "application/json, text/event-stream"}
HELLO = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "client", "version": "1"},
    },
}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_uprof_mcp_takes_the_cap_of_open_sessions_per_key(
    backend: Backend, kernel: Uprof, keys: ApiKeyStore
) -> None:
    token = keys.create(PLANNER).token
    port = _free_port()
    args = ["-m", "uprof.mcp", "--data-dir", str(kernel.settings.data_dir)]
    if backend.kind == "postgres":
        args += ["--database-url", backend.url]
    args += ["--embedder", "hashing", "mcp", "--transport", "http", "--port", str(port)]
    args += ["--max-sessions-per-key", "2"]
    server = subprocess.Popen(
        [sys.executable, *args],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        with httpx.Client(timeout=30) as client:
            deadline = time.monotonic() + 90
            while True:
                assert server.poll() is None, server.communicate()[1][-2000:]
                try:
                    client.get(f"http://127.0.0.1:{port}/")
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "uprof mcp did not start"
                    time.sleep(0.2)
            tries = [
                client.post(url, json=HELLO, headers={**ACCEPT, **bearer(token)}) for _ in range(3)
            ]
    finally:
        server.terminate()
        server.communicate(timeout=30)
    assert [t.status_code for t in tries] == [200, 200, 429], [t.text[:200] for t in tries]
    assert tries[2].json()["error"]["code"] == "too_many_sessions"
    assert "2 open MCP sessions" in tries[2].json()["error"]["message"]
