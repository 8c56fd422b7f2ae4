"""The SDK's readers of an audit export, against what a broken or hostile server streams
(decision 0171, 0172 and 0174's Left): bugs NC, ND, NE and NF.

- NC: ``audit_export`` (sync and async) collected the whole answer, however long; it now
  stops at ``AUDIT_EXPORT_MAX_BYTES`` with a ``TransportError`` naming the limit and
  ``audit_export_to``.
- ND: ``audit_export_to(path)`` left in its file what arrived before a refusal or an
  interruption (over a good file there before); the path now holds a whole export or
  what it held before.
- NE: the readers split an answer into lines differently (the sync stream at ``\\n``, the
  async spool also at ``\\r``, the whole-body reader at every ``str.splitlines`` break), so
  one answer gave a summary to one reader and a refusal to another; all split at ``\\n``
  only, as the verifier and the upload check do.
- NF: a line near the cap holding lone surrogates raised ``UnicodeEncodeError`` from the
  summary reader; it is refused as not UTF-8, naming the line.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.check import QUOTED_CHARS, check_upload
from audit.errors import VerificationError
from audit.export_format import (
    CSV_COLUMNS,
    MAX_LINE_BYTES,
    capped_lines,
    checked_lines,
    csv_line,
)
from audit.verify import verify_export
from tests.api.export_frames import header_line, trailer_line
from uprof.schemas.api import AuditExportSummary
from uprof.sdk import AsyncClient, Client, TransportError
from uprof.sdk import _client as sdk_client

HEADER = header_line()
TRAILER = trailer_line()
MEDIA = {"content-type": "application/x-ndjson; charset=utf-8"}
#: The documented limit of ``audit_export`` (docs/api.md).
LIMIT = 64 * 1024 * 1024


def _sync_client(body: Callable[[], Iterator[bytes]]) -> Client:
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=MEDIA, content=body())

    return Client("http://uprof.test", "k", transport=httpx.MockTransport(handle))


class _Stream(httpx.AsyncByteStream):
    def __init__(self, body: Callable[[], Iterator[bytes]]) -> None:
        self._body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._body():
            await asyncio.sleep(0)
            yield chunk


def _async_client(body: Callable[[], Iterator[bytes]]) -> AsyncClient:
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=MEDIA, stream=_Stream(body))

    return AsyncClient("http://uprof.test", "k", transport=httpx.MockTransport(handle))


def _read(body: Callable[[], Iterator[bytes]], how: str, folder: Path) -> object:
    """The summary one of the four readers makes of ``body`` (or the error it raises)."""
    dest = folder / f"{how}.jsonl"
    if how.startswith("sync"):
        client = _sync_client(body)
        with client:
            if how == "sync-whole":
                return client.audit_export().summary
            return client.audit_export_to(dest)

    async def run() -> object:
        async with _async_client(body) as client:
            if how == "async-whole":
                return (await client.audit_export()).summary
            return await client.audit_export_to(dest)

    return asyncio.run(run())


READERS = ["sync-whole", "sync-to", "async-whole", "async-to"]


# --- NC: the whole answer in memory, bounded ---------------------------------------------------


class _Counted:
    """A long answer that counts what the client pulled of it: a header, lines of 1 MiB of
    spaces (blank: the summary reader skips them) past the limit, a trailer."""

    CHUNK = 1 << 20

    def __init__(self) -> None:
        self.pulled = 0

    def __call__(self) -> Iterator[bytes]:
        for piece in self._pieces():
            self.pulled += len(piece)
            yield piece

    def _pieces(self) -> Iterator[bytes]:
        yield (HEADER + "\n").encode()
        for _ in range(LIMIT // self.CHUNK + 1):
            yield b" " * (self.CHUNK - 1) + b"\n"
        yield (TRAILER + "\n").encode()


@pytest.mark.parametrize("how", ["sync-whole", "async-whole"])
def test_audit_export_stops_at_its_documented_limit(how: str, tmp_path: Path) -> None:
    """NC: an answer over 64 MiB is refused naming the limit and ``audit_export_to``,
    having pulled no more than the limit and a chunk (on main: collected, 65 MiB+)."""
    body = _Counted()
    with pytest.raises(TransportError) as refused:
        _read(body, how, tmp_path)
    message = str(refused.value)
    assert str(LIMIT) in message and "audit_export_to" in message, message
    assert body.pulled <= LIMIT + 2 * _Counted.CHUNK, body.pulled


@pytest.mark.parametrize("how", ["sync-whole", "async-whole"])
def test_the_limit_counts_utf8_bytes_at_its_edge(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer of exactly the limit in UTF-8 bytes is read; one byte more is refused
    (a two-byte character counts two)."""
    header = HEADER.replace('"c"', '"c\u00e9"')
    text = f"{header}\n{TRAILER}\n"
    size = len(text.encode())
    monkeypatch.setattr(sdk_client, "AUDIT_EXPORT_MAX_BYTES", size)
    summary = _read(lambda: iter([text.encode()]), how, tmp_path)
    assert isinstance(summary, AuditExportSummary) and summary.checkpoint == "c\u00e9"
    monkeypatch.setattr(sdk_client, "AUDIT_EXPORT_MAX_BYTES", size - 1)
    with pytest.raises(TransportError, match=str(size - 1)):
        _read(lambda: iter([text.encode()]), how, tmp_path)


# --- ND: a refused or interrupted export leaves no partial file ---------------------------------


def _cut_short() -> Iterator[bytes]:
    yield (HEADER + "\n").encode()
    yield b'{"entry":{},"kind":"entry","leaf_index":0}\n'  # and no trailer


def _broken() -> Iterator[bytes]:
    yield (HEADER + "\n").encode()
    raise httpx.ReadError("connection reset")


def _over_the_cap() -> Iterator[bytes]:
    yield (HEADER + "\n").encode()
    for _ in range(MAX_LINE_BYTES // (1 << 20) + 1):
        yield b"x" * (1 << 20)


@pytest.mark.parametrize("how", ["sync-to", "async-to"])
@pytest.mark.parametrize("body", [_cut_short, _broken, _over_the_cap])
@pytest.mark.parametrize("before", [None, "a good export kept here\n"], ids=["new", "existing"])
def test_a_refused_export_leaves_no_partial_file(
    how: str, body: Callable[[], Iterator[bytes]], before: str | None, tmp_path: Path
) -> None:
    """ND: refused (cut short, over the line cap) or interrupted (the connection broke),
    the path holds what it held before, and nothing else is left in the folder (on main
    it held the header and whatever else arrived, over the good file)."""
    dest = tmp_path / f"{how}.jsonl"
    if before is not None:
        dest.write_text(before)
    with pytest.raises(TransportError):
        _read(body, how, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ([dest.name] if before else [])
    if before is not None:
        assert dest.read_text() == before


def test_a_cancelled_async_export_leaves_no_partial_file(tmp_path: Path) -> None:
    """ND, async: a task cancelled while the export streams removes its part."""
    dest = tmp_path / "trail.jsonl"
    dest.write_text("a good export kept here\n")
    arrived = asyncio.Event()

    class _Stalled(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield (HEADER + "\n").encode()
            arrived.set()
            await asyncio.Event().wait()  # never ends: the caller cancels
            yield b""

    async def run() -> None:
        def handle(request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, headers=MEDIA, stream=_Stalled())

        async with AsyncClient(
            "http://uprof.test", "k", transport=httpx.MockTransport(handle)
        ) as c:
            task = asyncio.create_task(c.audit_export_to(dest))
            await arrived.wait()  # the header was written: the stream was asked for more
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(run())
    assert [p.name for p in tmp_path.iterdir()] == [dest.name]
    assert dest.read_text() == "a good export kept here\n"


@pytest.mark.parametrize("how", ["sync-to", "async-to"])
def test_an_export_that_arrives_replaces_the_file_whole(how: str, tmp_path: Path) -> None:
    """ND: the export read whole is renamed over the path; no part is left beside it."""
    dest = tmp_path / f"{how}.jsonl"
    dest.write_text("an older export\n")
    body = f"{HEADER}\n{TRAILER}\n".encode()
    summary = _read(lambda: iter([body[:10], body[10:]]), how, tmp_path)
    assert isinstance(summary, AuditExportSummary) and summary.entry_count == 0
    assert dest.read_bytes() == body
    assert [p.name for p in tmp_path.iterdir()] == [dest.name]


def test_a_text_file_given_holds_what_arrived(tmp_path: Path) -> None:
    """A text file the caller gives is theirs: it holds what arrived (documented)."""
    out = io.StringIO()
    with pytest.raises(TransportError), _sync_client(_cut_short) as client:
        client.audit_export_to(out)
    assert out.getvalue().startswith(HEADER)


# --- NE: one definition of a line --------------------------------------------------------------

#: Every line break of ``str.splitlines`` but ``\n`` (and ``\r\n``, which starts with one).
BREAKS = ["\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("how", READERS)
@pytest.mark.parametrize("brk", BREAKS, ids=[f"U+{ord(b):04X}" for b in BREAKS])
def test_a_break_that_is_not_a_newline_does_not_end_a_line(
    brk: str, how: str, tmp_path: Path
) -> None:
    """NE: a header and a trailer joined by another break are one line, which is no JSON
    object: every reader refuses it (on main the whole-body readers, and the async spool at
    ``\\r``, read two lines and answered a summary the sync stream refused)."""
    body = f"{HEADER}{brk}{TRAILER}\n".encode()
    with pytest.raises(TransportError, match="malformed"):
        _read(lambda: iter([body]), how, tmp_path)


@pytest.mark.parametrize("brk", BREAKS, ids=[f"U+{ord(b):04X}" for b in BREAKS])
def test_the_verifier_and_the_upload_check_read_the_same_one_line(brk: str) -> None:
    """NE: the verifier and the upload check see the same bytes as one line (line 1, quoted
    whole up to the trailer), as the SDK's readers now do."""
    body = f"{HEADER}{brk}{TRAILER}\n".encode()
    key = Ed25519PrivateKey.generate().public_key()
    with pytest.raises(VerificationError) as refused:
        verify_export(body, key, "o")
    assert refused.value.line_number == 1
    checked = check_upload(body, "export", key, "o")
    assert not checked.ok and checked.line_number == 1
    # Quoted whole, cut at the quote's length: the break is inside the line.
    assert checked.line_text == f"{HEADER}{brk}{TRAILER}"[:QUOTED_CHARS]
    assert len(checked.line_text) > len(HEADER)


#: Breaks JSON allows unescaped in a string (the others are control characters).
IN_STRINGS = ["\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("how", READERS)
@pytest.mark.parametrize("brk", IN_STRINGS, ids=[f"U+{ord(b):04X}" for b in IN_STRINGS])
def test_a_break_inside_a_string_is_read_alike(brk: str, how: str, tmp_path: Path) -> None:
    """NE: a header whose string holds such a break is one line to every reader, and all
    four give the same summary (on main the whole-body readers split it and refused)."""
    header = HEADER.replace('"c"', f'"c{brk}d"')
    body = f"{header}\n{TRAILER}\n".encode()
    summary = _read(lambda: iter([body]), how, tmp_path)
    assert isinstance(summary, AuditExportSummary), summary
    assert summary.checkpoint == f"c{brk}d" and summary.entry_count == 0


# --- NF: lone surrogates near the cap ----------------------------------------------------------


def _surrogate_line() -> str:
    # Over a quarter of the cap, not ASCII: the reader counts its bytes.
    return "x" * (MAX_LINE_BYTES // 4 + 1) + "\udcff\n"


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_summary_refuses_lone_surrogates_as_not_utf8(fmt: str) -> None:
    """NF: text read with ``surrogateescape`` from a file that is not UTF-8 is refused as
    not UTF-8 naming the line (on main: ``UnicodeEncodeError`` about a position)."""
    first = csv_line(CSV_COLUMNS) if fmt == "csv" else HEADER + "\n"
    lines = [first, _surrogate_line(), TRAILER + "\n"]
    with pytest.raises(ValueError, match="line 2 is not UTF-8") as refused:
        AuditExportSummary.of_export(lines, fmt)
    assert not isinstance(refused.value, UnicodeError)


@pytest.mark.parametrize("reader", ["checked", "capped"])
def test_the_format_readers_refuse_lone_surrogates_naming_the_line(reader: str) -> None:
    """NF, the format's two readers (the owner of the count)."""
    text = HEADER + "\n" + _surrogate_line()
    lines = (
        checked_lines(io.StringIO(text).readlines())
        if reader == "checked"
        else capped_lines(io.StringIO(text).readline)
    )
    with pytest.raises(ValueError, match="line 2 is not UTF-8") as refused:
        list(lines)
    assert not isinstance(refused.value, UnicodeError)
