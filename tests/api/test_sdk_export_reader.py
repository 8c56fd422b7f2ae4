"""Review of 0169-small-leftovers: the SDK's readers of a streamed audit export against a
hostile or broken server (bug LG).

``audit_export_to`` promises to stream (one record in memory at a time), but the sync
client gathered a line until its newline, however long (and split the whole gathered
text again at every chunk), the async one read its spooled copy a line at a time,
however long; a CSV cell over the csv limit escaped as ``_csv.Error`` and a header that
is JSON but not an object as ``TypeError``, not as the SDK's ``TransportError``. Each
reader now stops at the trail's line cap (``audit.export_format.MAX_LINE_BYTES``) and
every malformed answer is a ``TransportError``.
"""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest

from audit.export_format import CSV_COLUMNS, MAX_LINE_BYTES, csv_line
from tests.api.export_frames import header_line, trailer_line
from uprof.sdk import AsyncClient, Client, TransportError

HEADER = header_line() + "\n"
COLUMNS = csv_line(CSV_COLUMNS).encode()
CHUNK = 1 << 20
#: A line ten times the cap, never ended: what a broken server could stream forever.
ENDLESS = 10 * MAX_LINE_BYTES


def _endless_line() -> Iterator[bytes]:
    yield HEADER.encode()
    for _ in range(ENDLESS // CHUNK):
        yield b"x" * CHUNK


class _Endless(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in _endless_line():
            yield chunk


def _sync_client(body: Callable[[], Iterator[bytes]] | bytes) -> Client:
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body if isinstance(body, bytes) else body())

    return Client("http://uprof.test", "k", transport=httpx.MockTransport(handle))


def _peak(run: Callable[[], object]) -> tuple[BaseException | None, int]:
    tracemalloc.start()
    try:
        run()
    except Exception as exc:  # the test asserts which
        return exc, tracemalloc.get_traced_memory()[1]
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return None, peak


def test_sync_export_to_a_file_stops_at_the_line_cap(tmp_path: Path) -> None:
    """LG: the sync client refuses a line over the cap after reading about the cap of it
    (on main it held the whole 40 MiB line, twice, before failing on it)."""
    client = _sync_client(_endless_line)
    refused, peak = _peak(lambda: client.audit_export_to(tmp_path / "trail.jsonl"))
    assert peak < 3 * MAX_LINE_BYTES, peak
    assert isinstance(refused, TransportError), refused
    assert f"longer than {MAX_LINE_BYTES}" in str(refused)


def test_async_export_to_a_file_stops_at_the_line_cap(tmp_path: Path) -> None:
    """LG: the async client reads its spooled copy back at most a cap of a line at a time."""

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=_Endless())

    async def run() -> object:
        client = AsyncClient("http://uprof.test", "k", transport=httpx.MockTransport(handle))
        try:
            return await client.audit_export_to(tmp_path / "trail.jsonl")
        finally:
            await client.aclose()

    refused, peak = _peak(lambda: asyncio.run(run()))
    assert peak < 3 * MAX_LINE_BYTES, peak
    assert isinstance(refused, TransportError), refused
    assert f"longer than {MAX_LINE_BYTES}" in str(refused)


@pytest.mark.parametrize(
    ("fmt", "body"),
    [
        # A CSV cell over the csv module's limit (the cap): was _csv.Error.
        ("csv", COLUMNS + b'header,"' + b"x" * (MAX_LINE_BYTES + 10) + b'"\n'),
        # A header that is JSON but not an object: was TypeError.
        ("jsonl", b"[1]\n" + b'{"kind":"trailer"}\n'),
        ("jsonl", b'"header"\n' + b'{"kind":"trailer","entry_count":1}\n'),
        # A trailer that is a list holding the marker text: was AttributeError.
        ("jsonl", HEADER.encode() + b'[{"kind":"trailer"}]\n'),
    ],
)
def test_a_malformed_export_is_a_transport_error(fmt: str, body: bytes) -> None:
    """LG: whatever the server streams, the SDK raises its own error, naming the call."""
    with pytest.raises(TransportError, match="audit_export"):
        _sync_client(body).audit_export(format=fmt)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_line_at_the_cap_is_read(tmp_path: Path, mode: str) -> None:
    """The cap's edge: an entry line of exactly ``MAX_LINE_BYTES`` (the longest an export
    holds) is read, in chunks that end anywhere, and the summary is the trail's."""
    trailer = trailer_line(1) + "\n"
    entry = '{"entry":' + "x" * (MAX_LINE_BYTES - len('{"entry":'))
    body = (HEADER + entry + "\n" + trailer).encode()
    pieces = [body[i : i + 65_537] for i in range(0, len(body), 65_537)]

    class _Pieces(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            for piece in pieces:
                yield piece

    if mode == "sync":
        summary = _sync_client(lambda: iter(pieces)).audit_export_to(tmp_path / "t.jsonl")
    else:

        async def run() -> object:
            def handle(request: httpx.Request) -> httpx.Response:
                return httpx.Response(200, stream=_Pieces())

            client = AsyncClient("http://uprof.test", "k", transport=httpx.MockTransport(handle))
            try:
                return await client.audit_export_to(tmp_path / "t.jsonl")
            finally:
                await client.aclose()

        summary = asyncio.run(run())
    assert (tmp_path / "t.jsonl").read_bytes() == body
    assert summary.entry_count == 1 and summary.tree_size == 1, summary
