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
import secrets
import socket
import subprocess
import sys
import time

import httpx

from tests.api.conftest import PLANNER, bearer
from tests.api.mcp_messages import ACCEPT, HELLO
from tests.conftest import Backend
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _serving(args: list[str], path: str) -> tuple[subprocess.Popen[str], str]:
    """``uprof mcp`` on a port picked free, answering at ``path``; its process and URL.

    The port is closed between the pick and the server's bind (``uprof mcp`` takes no
    handed-over socket), so another test's server may take it first: the clean-clone CI
    once saw this test's requests answered 401 by such a server. The readiness probe
    asks for this server's own random path (any other server answers 404) and a server
    that could not bind is started again on another port.
    """
    for _ in range(5):
        port = _free_port()
        server = subprocess.Popen(
            [sys.executable, *args, "--port", str(port), "--path", path],
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            stderr=subprocess.PIPE,
            text=True,
        )
        url = f"http://127.0.0.1:{port}{path}"
        deadline = time.monotonic() + 90
        with httpx.Client(timeout=30) as client:
            while server.poll() is None:
                try:
                    if client.get(url).status_code != 404:
                        return server, url
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "uprof mcp did not start"
                time.sleep(0.2)
        error = server.communicate()[1]
        assert "address already in use" in error.lower(), error[-2000:]
    raise AssertionError("no free port held for uprof mcp in 5 tries")


def test_uprof_mcp_takes_the_cap_of_open_sessions_per_key(
    backend: Backend, kernel: Uprof, keys: ApiKeyStore
) -> None:
    token = keys.create(PLANNER).token
    args = ["-m", "uprof.mcp", "--data-dir", str(kernel.settings.data_dir)]
    if backend.kind == "postgres":
        args += ["--database-url", backend.url]
    args += ["--embedder", "hashing", "mcp", "--transport", "http"]
    args += ["--max-sessions-per-key", "2"]
    server, url = _serving(args, f"/mcp-{secrets.token_hex(8)}")
    try:
        with httpx.Client(timeout=30) as client:
            tries = [
                client.post(url, json=HELLO, headers={**ACCEPT, **bearer(token)}) for _ in range(3)
            ]
        assert server.poll() is None, "the answers came from another process"
    finally:
        server.terminate()
        server.communicate(timeout=30)
    assert [t.status_code for t in tries] == [200, 200, 429], [t.text[:200] for t in tries]
    assert tries[2].json()["error"]["code"] == "too_many_sessions"
    assert "2 open MCP sessions" in tries[2].json()["error"]["message"]
