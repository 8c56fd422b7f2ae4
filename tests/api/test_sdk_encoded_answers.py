"""A compressed answer is refused before it is decoded (review of 0199 and 0201, bug QB).

Decision 0199 bounded every answer the SDK reads, but counted it after httpx decoded
it, and httpx decodes each piece read from the socket whole: an answer of 1,827 bytes on
the wire (``Content-Encoding: gzip, gzip``) made 2 GiB in the client before the bound saw
its first piece, ``zstd`` 1 GiB of 32 KiB (0199's Left said "one chunk may decode to more
than the bound"; it had no bound at all). The server never compresses: the SDK now asks
for ``Accept-Encoding: identity`` and refuses an answer that comes encoded anyway,
before a byte of it is read.

The server is real (uvicorn on loopback, ``tests.api.conftest.LiveServer``). What the
client held is measured with ``tracemalloc`` (the decoded bytes are Python objects).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import threading
import tracemalloc
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import LiveServer
from tests.api.test_sdk_answers_bounded import _Fixed
from uprof.sdk import AsyncClient, Client, TransportError

#: What the bomb decodes to: above the 64 MiB bound, below what hurts the test machine.
DECODED = 96 * 1024 * 1024
#: What a client that decodes nothing may hold around one call (the server's thread too).
HELD_AT_MOST = 8 * 1024 * 1024


def _zeros(encoding: str) -> bytes:
    """``DECODED`` zero bytes under ``encoding`` (a few KiB on the wire)."""
    if encoding == "zstd":
        zstandard = pytest.importorskip("zstandard")
        return bytes(zstandard.ZstdCompressor(level=19).compress(bytes(DECODED)))
    packer = zlib.compressobj(9, zlib.DEFLATED, 31 if encoding.startswith("gzip") else 15)
    block = bytes(1 << 20)
    body = b"".join(packer.compress(block) for _ in range(DECODED >> 20)) + packer.flush()
    if encoding == "gzip, gzip":
        body = gzip.compress(body, 9)
    return body


def _call(client: Any, call: str, folder: Path) -> Any:
    if call == "audit_export":
        return client.audit_export()
    if call == "audit_export_to":
        return client.audit_export_to(folder / "trail.jsonl")
    if call == "audit_proof":
        return client.audit_proof(1)
    return getattr(client, call)()


def _answer(url: str, how: str, call: str, folder: Path) -> tuple[Any, int]:
    """What ``call`` returned or raised, and the most the process held meanwhile."""
    tracemalloc.start()
    try:
        if how == "sync":
            with Client(url, "k", timeout_s=60, write_retries=0) as client:
                try:
                    got = _call(client, call, folder)
                except Exception as error:
                    got = error
        else:

            async def run() -> Any:
                async with AsyncClient(url, "k", timeout_s=60, write_retries=0) as client:
                    try:
                        return await _call(client, call, folder)
                    except Exception as error:
                        return error

            got = asyncio.run(run())
        return got, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _encoded(status: int, encoding: str) -> _Fixed:
    headers = [(b"content-type", b"application/json"), (b"content-encoding", encoding.encode())]
    return _Fixed(status, _zeros(encoding), headers)


@pytest.mark.parametrize("how", ["sync", "async"])
@pytest.mark.parametrize("encoding", ["gzip, gzip", "zstd", "deflate"])
def test_qb_a_compressed_answer_is_refused_undecoded(
    how: str, encoding: str, tmp_path: Path
) -> None:
    """Bug QB. main at f9d71eac: the 96 MiB were decoded (held whole, at once) and then
    refused by the 64 MiB bound as "longer than"."""
    with LiveServer(_encoded(200, encoding)) as server:
        got, held = _answer(server.url, how, "whoami", tmp_path)
    assert isinstance(got, TransportError), repr(got)
    assert "came encoded" in str(got) and encoding in str(got), str(got)
    assert held < HELD_AT_MOST, f"{held} bytes held for an answer of a few KiB"


@pytest.mark.parametrize("how", ["sync", "async"])
@pytest.mark.parametrize("call", ["audit_export", "audit_export_to", "audit_proof"])
@pytest.mark.parametrize("status", [200, 500])
def test_qb_every_reader_refuses_a_compressed_answer(
    how: str, call: str, status: int, tmp_path: Path
) -> None:
    """Bug QB, the other readers (the export's stream, the proof's bytes) and error
    answers. main at f9d71eac: decoded whole first."""
    with LiveServer(_encoded(status, "gzip, gzip")) as server:
        got, held = _answer(server.url, how, call, tmp_path)
    assert isinstance(got, TransportError), repr(got)
    assert "came encoded" in str(got) and f"status {status}" in str(got), str(got)
    assert held < HELD_AT_MOST, f"{held} bytes held for an answer of a few KiB"
    assert not (tmp_path / "trail.jsonl").exists()


class _Asked(_Fixed):
    """``_Fixed``, remembering the Accept-Encoding each request sent."""

    asked: list[bytes]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.asked.append(dict(scope["headers"]).get(b"accept-encoding", b""))
        await super().__call__(scope, receive, send)


@pytest.mark.parametrize("how", ["sync", "async"])
def test_qb_the_sdk_asks_for_answers_as_they_are_and_reads_them(how: str, tmp_path: Path) -> None:
    """Bug QB: the SDK asks for ``identity`` (so a proxy that compresses for a client
    that asks does not for it), and an answer marked ``identity`` is read as before.
    main at f9d71eac: httpx's own ask, ``gzip, deflate, zstd``."""
    who = b'{"app_id": "app:planner", "key_id": "k1", "roles": ["app"]}'
    headers = [(b"content-type", b"application/json"), (b"content-encoding", b"identity")]
    app = _Asked(200, who, headers)
    app.asked = []
    with LiveServer(app) as server:
        got, _ = _answer(server.url, how, "whoami", tmp_path)
    assert getattr(got, "app_id", None) == "app:planner", repr(got)
    assert app.asked == [b"identity"]


#: Answers no honest server sends, each as its raw bytes (a lying length, headers
#: without end): the SDK must end each with ``TransportError``, holding little.
LIES = {
    "length-shorter-than-body": b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{" + b" " * 100_000,
    "length-longer-than-body": b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n{}",
    "headers-without-end": b"HTTP/1.1 200 OK\r\n" + b"X-A: " + b"a" * 1000 + b"\r\n",
}


@contextlib.contextmanager
def _lying(answer: bytes, endless: bool) -> Iterator[str]:
    """A loopback server answering every connection with ``answer`` (again and again
    while the client reads, when ``endless``), then closing it."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                conn.recv(65536)
                conn.sendall(answer)
                while endless:
                    conn.sendall(answer[answer.index(b"X-A") :])

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


@pytest.mark.parametrize("how", ["sync", "async"])
@pytest.mark.parametrize("lie", list(LIES))
def test_held_a_lying_answer_ends_in_a_transport_error(how: str, lie: str, tmp_path: Path) -> None:
    """Held (0199's PV attacked on the wire): a length shorter than the body (the rest is
    not read: "unexpected response"), a length longer than what comes (the connection
    ends: ``RemoteProtocolError``), headers without end (h11's bound)."""
    with _lying(LIES[lie], endless=lie == "headers-without-end") as url:
        got, held = _answer(url, how, "whoami", tmp_path)
    assert isinstance(got, TransportError), repr(got)
    assert held < HELD_AT_MOST, f"{held} bytes held"
