"""Every answer to an ordinary JSON call of the SDK is read up to a bound (bug PV;
decision 0194's Left).

``send`` (every call but the export and the proof: ``whoami``, ``slice``, ``capture``,
``export_subject`` ...) took its answer whole through httpx before looking at it: a broken
or hostile server (the SDK talks to whatever URL the app is configured with) answering
with a body without end took the app's memory. Now an answer of status below 400 is read
up to ``MAX_ANSWER_BYTES`` (64 MiB) and an error's up to ``MAX_ERROR_BODY_BYTES`` (1 MiB);
one byte more is a ``TransportError`` naming the call, the status and the bound, and the
connection is dropped.

The server is real: uvicorn on a loopback socket (``tests.api.conftest.LiveServer``)
serving a small ASGI app that streams the body in chunks, so the bound is shown on the
sockets the SDK really reads, and the server counts what it could send before the client
went away.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from tests.api.conftest import LiveServer
from uprof.sdk import AsyncClient, Client, ServiceUnavailableError, TransportError

#: The documented bounds (docs/api.md "SDK").
ANSWER_LIMIT = 64 * 1024 * 1024
ERROR_LIMIT = 1024 * 1024
CHUNK = 256 * 1024
#: What the server offers past the bound: more than every socket buffer between the two
#: ends (a few MiB on loopback), so a client that stops at the bound leaves some unsent.
BEYOND = 48 * 1024 * 1024


async def _lifespan(receive: Any, send: Any) -> None:
    """Start and stop at once (the ASGI lifespan protocol)."""
    while True:
        kind = (await receive())["type"]
        await send({"type": f"{kind}.complete"})
        if kind == "lifespan.shutdown":
            return


async def _one_turn_of_the_loop() -> None:
    """Let every callback the event loop already has ready run (no time passes)."""
    await asyncio.sleep(0)


class _Endless:
    """An ASGI app answering every request with ``status`` and ``size`` bytes in chunks
    (a JSON object's start, then blanks: never a whole answer), counting what it sent."""

    def __init__(self, status: int, size: int) -> None:
        self.status = status
        self.size = size
        self.sent = 0
        self.done = threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        while (await receive()).get("more_body"):
            pass  # the request's body, unread
        # The next message is the client going away; uvicorn drops what is sent after it
        # without a word, so the app stops sending (and counting) once it came.
        gone = asyncio.ensure_future(receive())
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            piece = b"{" + b" " * (CHUNK - 1)
            while self.sent < self.size and not gone.done():
                await send({"type": "http.response.body", "body": piece, "more_body": True})
                self.sent += len(piece)
                piece = b" " * CHUNK
                # A send waits only while the socket is full. A client that went away
                # while the app was between sends (its reset met by a write: uvloop then
                # drops every later write at once and tells uvicorn on the loop's next
                # turn) left a loop that never waited: it counted the whole answer as
                # sent, the client's leaving never seen (a flake under load). One turn of
                # the loop per piece lets the news in: ``gone`` is done within two pieces.
                await _one_turn_of_the_loop()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            gone.cancel()
            self.done.set()


#: One call of each kind ``send`` carries: a GET, a read, a keyed write (sent again after
#: a network failure), a subject's export.
SYNC_CALLS: dict[str, Callable[[Client], object]] = {
    "whoami": lambda c: c.whoami(),
    "slice": lambda c: c.slice(
        "alice", "diet", budget_tokens=100, purpose="personalization", agent_id="a"
    ),
    "capture": lambda c: c.capture("alice", agent_id="a", user_input="hello"),
    "export_subject": lambda c: c.export_subject("alice"),
}
ASYNC_CALLS: dict[str, Callable[[AsyncClient], Awaitable[object]]] = {
    "whoami": lambda c: c.whoami(),
    "slice": lambda c: c.slice(
        "alice", "diet", budget_tokens=100, purpose="personalization", agent_id="a"
    ),
    "capture": lambda c: c.capture("alice", agent_id="a", user_input="hello"),
    "export_subject": lambda c: c.export_subject("alice"),
}


@pytest.fixture
def serving() -> Iterator[Callable[[_Endless], LiveServer]]:
    started: list[LiveServer] = []

    def serve(app: _Endless) -> LiveServer:
        server = LiveServer(app).__enter__()
        started.append(server)
        return server

    yield serve
    for server in started:
        server.__exit__(None, None, None)


def _called(url: str, how: str, call: str) -> BaseException | object:
    """What ``call`` of the sync or async client returns, or raises."""
    if how == "sync":
        with Client(url, "k", timeout_s=120, write_retries=0) as client:
            try:
                return SYNC_CALLS[call](client)
            except Exception as error:
                return error

    async def run() -> BaseException | object:
        async with AsyncClient(url, "k", timeout_s=120, write_retries=0) as client:
            try:
                return await ASYNC_CALLS[call](client)
            except Exception as error:
                return error

    return asyncio.run(run())


@pytest.mark.parametrize("how", ["sync", "async"])
@pytest.mark.parametrize(
    ("status", "limit"), [(200, ANSWER_LIMIT), (500, ERROR_LIMIT)], ids=["success", "error"]
)
@pytest.mark.parametrize("call", ["whoami", "capture"])
def test_an_endless_answer_is_refused_at_the_bound(
    serving: Callable[[_Endless], LiveServer], how: str, status: int, limit: int, call: str
) -> None:
    """PV: an answer of ``limit`` and 48 MiB more is refused once the bound is passed,
    naming the call, the status and the bound; the server could not send it all (on
    main: read whole, then "unexpected response" or the status's error)."""
    app = _Endless(status, limit + BEYOND)
    got = _called(serving(app).url, how, call)
    assert isinstance(got, TransportError), repr(got)
    said = str(got)
    assert call in said and f"status {status}" in said and str(limit) in said, said
    assert app.done.wait(120), "the server never finished its answer"
    assert app.sent < limit + BEYOND, (app.sent, limit + BEYOND)


@pytest.mark.parametrize("how", ["sync", "async"])
@pytest.mark.parametrize("call", ["slice", "export_subject"])
def test_every_json_call_is_bounded(
    serving: Callable[[_Endless], LiveServer], how: str, call: str
) -> None:
    """PV, the other calls ``send`` carries: an endless error answer is refused at 1 MiB
    (on main: read whole)."""
    app = _Endless(503, ERROR_LIMIT + BEYOND)
    got = _called(serving(app).url, how, call)
    assert isinstance(got, TransportError), repr(got)
    assert call in str(got) and str(ERROR_LIMIT) in str(got), str(got)


class _Fixed:
    """An ASGI app answering every request with one body, in chunks."""

    def __init__(self, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.status, self.body, self.headers = status, body, headers

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        for at in range(0, len(self.body), CHUNK):
            piece = self.body[at : at + CHUNK]
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


@pytest.mark.parametrize("how", ["sync", "async"])
def test_answers_at_the_bound_are_still_read(how: str) -> None:
    """Held, the edges: an error body of exactly 1 MiB is the SDK's error for its status
    with its Retry-After, and a success of exactly 64 MiB (``whoami``'s JSON padded with
    blanks) is the answer."""
    error = b'{"error": {"code": "store_unavailable", "message": "no store", "details": []}}'
    headers = [(b"content-type", b"application/json"), (b"retry-after", b"7")]
    with LiveServer(_Fixed(503, error + b" " * (ERROR_LIMIT - len(error)), headers)) as server:
        got = _called(server.url, how, "whoami")
    assert isinstance(got, ServiceUnavailableError), repr(got)
    assert "no store" in str(got) and got.retry_after_s == 7
    who = b'{"app_id": "app:planner", "key_id": "k1", "roles": ["app"]}'
    with LiveServer(_Fixed(200, who + b" " * (ANSWER_LIMIT - len(who)), headers)) as server:
        answer = _called(server.url, how, "whoami")
    assert getattr(answer, "app_id", None) == "app:planner", repr(answer)[:400]
