"""The SDK's reading of an audit export a server streams to it is bounded by the format's
line cap, ``audit.export_format.MAX_LINE_BYTES`` (decision 0169), as the verifier is (bug LU).

``Client.audit_export_to`` and ``AsyncClient.audit_export_to`` rebuild the export's summary
from the lines they receive (``AuditExportSummary.of_export``). A hostile or broken server
(the caller chose it, nothing vouches for it) answered one line of any length, without a
newline or with one: the sync client joined the whole line in memory before anything
looked at it (and re-split everything it held with each chunk, quadratic in the line), the
async client read it whole from its spooled copy, and ``csv`` parsed a line of many small
cells whatever its length. Now a line longer than the cap is refused once the cap is
passed, as a ``TransportError`` that names the cap, with memory bounded by the cap.
"""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from audit.export_format import MAX_LINE_BYTES
from uprof.schemas.api import AuditExportSummary
from uprof.sdk import AsyncClient, Client, TransportError

#: A hostile line: four times the cap (16 MiB), sent in 64 KiB chunks.
HOSTILE_CHARS = 4 * MAX_LINE_BYTES
CHUNK = 64 * 1024
#: Reading a hostile line may cost a few times the cap (the cap's text, one chunk, its
#: copies while it is joined), never the line.
PEAK_BOUND = 3 * MAX_LINE_BYTES


def _hostile_body(fmt: str, newline: bool) -> Iterator[bytes]:
    # CSV: the column names, then a "header" row of many small cells (no cell near the csv
    # field limit); JSONL: one line of spaces and a brace. Either way the line is long.
    yield b"kind,entry\n" if fmt == "csv" else b""
    yield b"header"
    cell = (b"," if fmt == "csv" else b" ") * CHUNK
    for _ in range(HOSTILE_CHARS // CHUNK):
        yield cell
    yield b"\n" if newline else b""


async def _async_body(fmt: str, newline: bool) -> AsyncIterator[bytes]:
    for chunk in _hostile_body(fmt, newline):
        yield chunk


def _transport(fmt: str, newline: bool, *, asynchronous: bool = False) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        media = "text/csv" if fmt == "csv" else "application/x-ndjson"
        body = _async_body(fmt, newline) if asynchronous else _hostile_body(fmt, newline)
        return httpx.Response(200, headers={"content-type": media}, content=body)

    return httpx.MockTransport(handle)


def _peak_of(run: object) -> tuple[BaseException | None, int]:
    tracemalloc.start()
    try:
        try:
            run()  # type: ignore[operator]
        except BaseException as error:
            return error, tracemalloc.get_traced_memory()[1]
        return None, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _assert_refused_naming_the_cap(error: BaseException | None, peak: int) -> None:
    assert isinstance(error, TransportError), repr(error)
    assert str(MAX_LINE_BYTES) in str(error), str(error)
    assert peak < PEAK_BOUND, f"peak {peak} bytes reading a {HOSTILE_CHARS}-byte line"


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@pytest.mark.parametrize("newline", [False, True], ids=["no-newline", "newline"])
def test_the_sdk_refuses_a_hostile_export_line_within_the_cap(
    fmt: str, newline: bool, tmp_path: Path
) -> None:
    """Bug LU: a line over the cap (16 MiB of small CSV cells or JSONL spaces) streamed to
    ``audit_export_to`` is refused naming the cap, reading at most about the cap."""
    client = Client("http://uprof.test", "k", transport=_transport(fmt, newline))
    # To a file: what the caller keeps of the answer is not the reader's memory.
    error, peak = _peak_of(lambda: client.audit_export_to(tmp_path / "export", format=fmt))
    _assert_refused_naming_the_cap(error, peak)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_the_async_sdk_refuses_a_hostile_export_line_within_the_cap(
    fmt: str, tmp_path: Path
) -> None:
    """Bug LU, the async client: it spools what it receives and reads the summary back
    from the spool, a line at a time, at most the cap of one."""

    async def export() -> None:
        async with AsyncClient(
            "http://uprof.test", "k", transport=_transport(fmt, True, asynchronous=True)
        ) as c:
            await c.audit_export_to(tmp_path / "export", format=fmt)

    error, peak = _peak_of(lambda: asyncio.run(export()))
    _assert_refused_naming_the_cap(error, peak)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_the_summary_reader_refuses_a_line_over_the_cap(fmt: str) -> None:
    """``of_export`` itself (the in-memory ``audit_export`` and the server's own summary
    use it) refuses a line over the cap, naming it, before csv or json parses it."""
    line = ("header" + ("," if fmt == "csv" else " ") * MAX_LINE_BYTES) + "\n"
    lines = (["kind,entry\n"] if fmt == "csv" else []) + [line]
    with pytest.raises(ValueError, match=f"longer than {MAX_LINE_BYTES} bytes"):
        AuditExportSummary.of_export(lines, fmt)
