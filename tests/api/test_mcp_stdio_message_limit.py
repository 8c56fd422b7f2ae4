"""MCP over stdio reads no message past the HTTP transport's body limit (decision 0173's
Left, bug NJ): a real ``uprof mcp --transport stdio`` subprocess, its stdin a pipe."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from typing import Any

import pytest

from tests.api.conftest import PLANNER
from tests.api.mcp_messages import HELLO, rpc
from tests.conftest import Backend
from uprof.api import ApiKeyStore
from uprof.api.limits import DEFAULT_MAX_BODY_BYTES
from uprof.kernel import Uprof

#: Far past the default limit (1 MiB), and far past what the server needs to run.
OVERSIZED_BYTES = 64 * 1024 * 1024


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/<pid>/status")


class _Answers:
    """The server's stdout, a JSON-RPC message a line, read by a thread."""

    def __init__(self, child: subprocess.Popen[bytes]) -> None:
        self._lines: queue.Queue[bytes] = queue.Queue()
        assert child.stdout is not None
        stdout = child.stdout
        threading.Thread(target=lambda: [self._lines.put(x) for x in stdout], daemon=True).start()

    def next(self) -> dict[str, Any]:
        # A bound only so that a server that never answers fails the test, not hangs it.
        answer: dict[str, Any] = json.loads(self._lines.get(timeout=120))
        return answer


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_stdio_message_over_the_limit_is_refused_unread_and_the_session_goes_on(
    backend: Backend, kernel: Uprof, keys: ApiKeyStore
) -> None:
    """Bug NJ: the SDK's stdio transport read and parsed a line of any size whole (a
    64 MiB call was parsed, then refused for its parameters, -32602). Now
    a line past ``--max-body-bytes`` (1 MiB by default, HTTP's body limit) is dropped
    as it is read, answered with a JSON-RPC error (id null, ``payload_too_large`` in its
    data, as HTTP's 413 body), and the next message is served."""
    token = keys.create(PLANNER).token
    args = [sys.executable, "-m", "uprof.mcp", "--data-dir", str(kernel.settings.data_dir)]
    args += ["--embedder", "hashing", "mcp", "--transport", "stdio"]
    env = {**os.environ, "UPROF_API_KEY": token, "HF_HUB_OFFLINE": "1"}
    child = subprocess.Popen(
        args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
    )
    try:
        assert child.stdin is not None
        answers = _Answers(child)

        def send(line: bytes) -> None:
            assert child.stdin is not None
            child.stdin.write(line + b"\n")
            child.stdin.flush()

        send(json.dumps(HELLO).encode())
        assert answers.next()["id"] == 1
        send(rpc("notifications/initialized").encode())
        before = _peak_rss_kib(child.pid)
        # A string argument of a tools/call, as a host copying a huge text into it would.
        head = b'{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"x": "'
        send(head + b"a" * OVERSIZED_BYTES + b'"}}')
        refused = answers.next()
        grown_kib = _peak_rss_kib(child.pid) - before

        assert refused["id"] is None, refused
        assert refused["error"]["code"] == -32600
        assert refused["error"]["data"]["error"]["code"] == "payload_too_large"
        assert str(DEFAULT_MAX_BODY_BYTES) in refused["error"]["message"]
        # Never held whole: far less than the line (a read of it whole grows by more).
        assert grown_kib * 1024 < OVERSIZED_BYTES // 4, grown_kib
        send(rpc("tools/list", 3).encode())
        listed = answers.next()
        assert listed["id"] == 3
        assert {"profile_slice", "capture", "forget"} <= {
            t["name"] for t in listed["result"]["tools"]
        }
    finally:
        if child.stdin is not None:
            child.stdin.close()
        try:
            child.wait(60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
