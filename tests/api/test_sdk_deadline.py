"""``timeout_s`` bounds a whole SDK call, not each read (bug RL).

A real loopback server that answers slowly on purpose: its headers a byte at a time, its
body a byte at a time, or ``100 Continue`` again and again, each piece well within one
read's timeout. httpx's timeouts are per read, so such a server held a call as long as
it liked (``whoami`` with ``timeout_s=1`` past 12 s, 0203-review-of-0199-and-0201). Each
server here gives in after a while and sends a whole answer: without the deadline the
call returns, and the test fails, instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from uprof.sdk import AsyncClient, Client, TransportError

#: Seconds between two pieces of the slow answer, and how many pieces come slowly: the
#: whole answer takes about two seconds, a read never waits more than a twentieth.
GAP_S = 0.05
PIECES = 40
#: The bound under test: ten gaps, a fifth of the whole slow answer.
BOUND_S = 0.5

WHOAMI = json.dumps({"app_id": "app:one", "key_id": "k1", "roles": ["app"]}).encode()


def _answer(body: bytes) -> bytes:
    head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        piece = conn.recv(65536)
        if not piece:
            return
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            while len(body) < int(value):
                piece = conn.recv(65536)
                if not piece:
                    return
                body += piece


def _slow(mode: str, answer: bytes) -> Iterator[bytes]:
    """The pieces of ``answer`` as the hostile server sends them, ``GAP_S`` apart."""
    if mode == "headers":
        yield from (answer[i : i + 1] for i in range(PIECES))
        yield answer[PIECES:]
    elif mode == "body":
        head, _, body = answer.partition(b"\r\n\r\n")
        yield head + b"\r\n\r\n"
        yield from (body[i : i + 1] for i in range(len(body)))
    else:  # "continue": informational answers without end, then the answer
        yield from (b"HTTP/1.1 100 Continue\r\n\r\n" for _ in range(PIECES))
        yield answer


class _HostileServer:
    def __init__(self, mode: str, body: bytes) -> None:
        self._answer = _answer(body)
        self._mode = mode
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            _read_request(conn)
            for piece in _slow(self._mode, self._answer):
                if self._stop.is_set():
                    return
                conn.sendall(piece)
                time.sleep(GAP_S)

    def close(self) -> None:
        self._stop.set()
        self._sock.close()


MODES = ("headers", "body", "continue")

#: Each kind of call: a JSON call, a keyed write (sent again after a timeout), a byte
#: call, and the body the slow server finally sends it.
CALLS: dict[str, tuple[Callable[[Any], Any], bytes]] = {
    "whoami": (lambda client: client.whoami(), WHOAMI),
    "capture": (
        lambda client: client.capture("alice", agent_id="agent:one", user_input="hello"),
        WHOAMI,
    ),
    "audit_proof": (lambda client: client.audit_proof(1), b"proof " * PIECES),
}


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _assert_expired(error: BaseException | None, name: str) -> None:
    assert isinstance(error, TransportError), f"{name} returned: no deadline"
    assert name in str(error) and f"timeout_s={BOUND_S}" in str(error), str(error)


def _run_sync(mode: str, body: bytes, call: Callable[[Client], Any]) -> BaseException | None:
    server = _HostileServer(mode, body)
    try:
        with Client(server.url, "uprof_test_key", timeout_s=BOUND_S) as client:
            try:
                call(client)
            except TransportError as error:
                return error
            return None
    finally:
        server.close()


def _run_async(mode: str, body: bytes, call: Callable[[AsyncClient], Any]) -> BaseException | None:
    server = _HostileServer(mode, body)

    async def run() -> BaseException | None:
        async with AsyncClient(server.url, "uprof_test_key", timeout_s=BOUND_S) as client:
            try:
                await call(client)
            except TransportError as error:
                return error
            return None

    try:
        return asyncio.run(run())
    finally:
        server.close()


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_slow_server_cannot_hold_a_call_past_timeout_s(mode: str, name: str) -> None:
    call, body = CALLS[name]
    _assert_expired(_run_sync(mode, body, call), name)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_slow_server_cannot_hold_an_async_call_past_timeout_s(mode: str, name: str) -> None:
    call, body = CALLS[name]
    _assert_expired(_run_async(mode, body, call), name)


STREAM_MODES = ("headers", "continue")


@pytest.mark.parametrize("stream_mode", STREAM_MODES)
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_streamed_export_waits_for_its_answer_no_longer_than_timeout_s(
    stream_mode: str, asynchronous: bool, tmp_path: Path
) -> None:
    """A streamed export's answer (its status and headers) comes within the bound, or
    the call fails naming it, and nothing is written at the path."""
    dest = tmp_path / "trail.jsonl"
    if asynchronous:
        error = _run_async(stream_mode, b"", lambda client: client.audit_export_to(dest))
    else:
        error = _run_sync(stream_mode, b"", lambda client: client.audit_export_to(dest))
    _assert_expired(error, "audit_export")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
