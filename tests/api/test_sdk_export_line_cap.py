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

from audit.export_format import CSV_COLUMNS, MAX_LINE_BYTES, csv_line
from tests.api.export_frames import header_line, trailer_line
from uprof.schemas.api import AuditExportSummary
from uprof.sdk import AsyncClient, Client, TransportError

#: A hostile line: four times the cap (16 MiB), sent in 64 KiB chunks.
HOSTILE_CHARS = 4 * MAX_LINE_BYTES
CHUNK = 64 * 1024
#: Reading a hostile line may cost a few times the cap (the cap's text, one chunk, its
#: copies while it is joined), never the line.
PEAK_BOUND = 3 * MAX_LINE_BYTES


#: The column row a CSV export starts with (the summary reads the frame: bug OF).
_COLUMNS = csv_line(CSV_COLUMNS)


def _hostile_body(fmt: str, newline: bool) -> Iterator[bytes]:
    # CSV: the column names, then a "header" row of many small cells (no cell near the csv
    # field limit); JSONL: one line of spaces and a brace. Either way the line is long.
    yield _COLUMNS.encode() if fmt == "csv" else b""
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
    lines = ([_COLUMNS] if fmt == "csv" else []) + [line]
    with pytest.raises(ValueError, match=f"longer than {MAX_LINE_BYTES} bytes"):
        AuditExportSummary.of_export(lines, fmt)


#: A CSV export whose header row opens a quoted cell and never closes it: each line is
#: short (under the cap), but ``csv`` joins them into one record, a cell per line.
RECORD_LINES = 3_000_000


def _one_endless_record() -> Iterator[bytes]:
    yield b"kind,leaf_index,recorded_at,action,app_id,subject_ref,entry,inclusion,data\n"
    yield b'header,"\n'
    lines = b'x","\n' * (CHUNK // 5)
    for _ in range(RECORD_LINES // (CHUNK // 5)):
        yield lines


def test_a_csv_record_never_runs_on_over_lines(tmp_path: Path) -> None:
    """Bug MA: the format has one record per line (the verifier reads each line alone),
    but the summary reader handed its lines to one ``csv.reader``, which carries a quoted
    cell on into the next line: a server streaming short lines that each close a cell and
    open the next grew one record without end (15 MB streamed cost 177 MB, and more with
    every line), whatever the line cap. Each line is read as its own record now, so no
    record or cell is longer than its line (nor than the cap, whatever csv limit the host
    application set: bug LI); this answer is refused at its header."""

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=_one_endless_record())

    client = Client("http://uprof.test", "k", transport=httpx.MockTransport(handle))
    error, peak = _peak_of(lambda: client.audit_export_to(tmp_path / "export", format="csv"))
    assert isinstance(error, TransportError), repr(error)
    assert peak < PEAK_BOUND, f"peak {peak} bytes reading short lines"


#: A line the cap long and one character more, sent eight bytes at a time (HTTP's chunked
#: encoding lets a server end a chunk anywhere; httpx hands over each as it comes).
SMALL_PIECE = 8


def _line_in_small_pieces() -> Iterator[bytes]:
    yield (header_line() + "\n").encode()
    for _ in range(MAX_LINE_BYTES // SMALL_PIECE + 1):
        yield b"abcdefgh"


def test_a_line_sent_in_small_pieces_costs_the_cap_not_a_string_per_piece(
    tmp_path: Path,
) -> None:
    """Bug MB: the sync reader kept the unended part of a line as a list of the pieces it
    came in, bounded in characters (the cap) but not in objects: a server sending its
    line a few bytes at a time made it hold a string (about 50 bytes) and a list slot
    per piece, 10 to 35 times the cap (2-byte pieces: 147 MB). It is refused at the cap,
    having held about the cap."""

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=_line_in_small_pieces())

    client = Client("http://uprof.test", "k", transport=httpx.MockTransport(handle))
    error, peak = _peak_of(lambda: client.audit_export_to(tmp_path / "export"))
    assert isinstance(error, TransportError), repr(error)
    assert str(MAX_LINE_BYTES) in str(error), str(error)
    assert peak < PEAK_BOUND, f"peak {peak} bytes reading a line of the cap in small pieces"


_HEADER = (header_line() + "\n").encode()
_TRAILER = (trailer_line(1) + "\n").encode()
#: An entry line starts so (its canonical JSON): the frame reads any other as the trailer.
_ENTRY = b'{"entry":'


def _pieces_around_the_cap(line: bytes) -> Iterator[bytes]:
    """An export with ``line`` between header and trailer, cut exactly where the line's
    cap ends (inside a multi-byte character, or between CR and LF), then every 64 KiB."""
    body = _HEADER + _ENTRY + line[len(_ENTRY) :] + _TRAILER
    cut = len(_HEADER) + MAX_LINE_BYTES
    yield body[:cut]
    for start in range(cut, len(body), CHUNK):
        yield body[start : start + CHUNK]


_X = MAX_LINE_BYTES


@pytest.mark.parametrize(
    ("line", "kept"),
    [
        (b"x" * (_X - 1) + b"\n", True),
        (b"x" * _X + b"\n", True),
        (b"x" * (_X + 1) + b"\n", False),
        (b"x" * (_X - 2) + "é".encode() + b"\n", True),  # the cap in bytes, one char less
        (b"x" * (_X - 1) + "é".encode() + b"\n", False),  # the cap in chars, a byte over
        (b"x" * (_X - 3) + "€".encode() + b"\n", True),  # the cut inside the character
        # CR is a byte of the line: at the cap with it, the line is read, and refused as
        # ended by \r\n, as the verifier refuses it (bug OF), not as over the cap.
        (b"x" * (_X - 1) + b"\r\n", "crlf"),
        (b"x" * _X + b"\r\n", False),  # the cut between CR and LF
    ],
    ids=[
        "cap-1",
        "cap",
        "cap+1",
        "2-byte-at-cap",
        "2-byte-over",
        "3-byte-cut",
        "cr-at-cap",
        "cr-over",
    ],
)
def test_both_readers_count_the_cap_in_bytes_at_its_edges(
    line: bytes, kept: bool | str, tmp_path: Path
) -> None:
    """Held (review of 0171/0172): the sync and async readers agree at the cap's edges,
    a line of the cap in UTF-8 bytes read, one byte more refused naming the cap, whether
    the last character is one byte or several and wherever a chunk ends in it."""

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=_pieces_around_the_cap(line))

    async def handle_async(request: httpx.Request) -> httpx.Response:
        async def body() -> AsyncIterator[bytes]:
            for piece in _pieces_around_the_cap(line):
                yield piece

        return httpx.Response(200, content=body())

    async def export_async() -> AuditExportSummary:
        transport = httpx.MockTransport(handle_async)
        async with AsyncClient("http://uprof.test", "k", transport=transport) as c:
            return await c.audit_export_to(tmp_path / "async")

    client = Client("http://uprof.test", "k", transport=httpx.MockTransport(handle))
    for read in (
        lambda: client.audit_export_to(tmp_path / "sync"),
        lambda: asyncio.run(export_async()),
    ):
        if kept == "crlf":
            with pytest.raises(TransportError, match=r"ends with \\r\\n"):
                read()
        elif kept:
            summary = read()
            assert (summary.tree_size, summary.entry_count) == (1, 1)
        else:
            with pytest.raises(TransportError, match=str(MAX_LINE_BYTES)):
                read()
