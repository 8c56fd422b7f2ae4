"""Review of decision 0179's ``audit_export_to(path)`` (written beside the path and
renamed over it), attacked with paths that are not a plain file (bug NS, and what held),
and of 0182's MCP stdio line limit (NJ) at its edges (held). No storage is involved: the
export streams through ``httpx.MockTransport``, the stdio reader reads a byte buffer (the
real subprocess is ``test_mcp_stdio_message_limit.py``'s)."""

from __future__ import annotations

import asyncio
import io
import os
import stat
from pathlib import Path

import anyio
import pytest

from tests.api.test_sdk_readers_bounded import HEADER, TRAILER, _async_client, _sync_client
from uprof.mcp.stdio import BoundedLines

BODY = f"{HEADER}\n{TRAILER}\n".encode()


def _export_to(dest: Path, how: str) -> object:
    if how == "sync":
        with _sync_client(lambda: iter([BODY])) as client:
            return client.audit_export_to(dest)

    async def run() -> object:
        async with _async_client(lambda: iter([BODY])) as client:
            return await client.audit_export_to(dest)

    return asyncio.run(run())


def _drain(fd: int) -> bytes:
    out = b""
    while True:
        try:
            piece = os.read(fd, 65536)
        except BlockingIOError:  # nothing was ever written to it
            return out
        if not piece:
            return out
        out += piece


@pytest.mark.parametrize("how", ["sync", "async"])
def test_an_export_to_a_fifo_is_written_into_it_not_over_it(how: str, tmp_path: Path) -> None:
    """Bug NS: 0179 (ND) renamed a part file over every path. A FIFO (or a device:
    ``/dev/stdout``, ``/dev/null``) is a stream the caller reads, not a file a partial
    export could be left in: the FIFO was replaced by a regular file and its reader got
    nothing (run as root, ``/dev/stdout`` itself would have been replaced). A path that
    is not a regular file is written into, as before 0179."""
    fifo = tmp_path / "export.jsonl"
    os.mkfifo(fifo)
    # The reader end open first (without blocking), so that the writer's open returns;
    # the export (a few bytes) fits in the pipe's buffer.
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        summary = _export_to(fifo, how)
        got = _drain(reader)
    finally:
        os.close(reader)
    assert getattr(summary, "entry_count", None) == 0
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced"
    assert got == BODY
    assert [p.name for p in tmp_path.iterdir()] == [fifo.name]


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_symlink_at_the_path_is_replaced_its_target_untouched(how: str, tmp_path: Path) -> None:
    """Held (0179's Left, documented): a link planted at the path is replaced, never
    written through, so it cannot send the export (or a truncation) elsewhere."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere / "precious.txt"
    target.write_text("kept\n")
    folder = tmp_path / "out"
    folder.mkdir()
    link = folder / "export.jsonl"
    link.symlink_to(target)
    _export_to(link, how)
    assert target.read_text() == "kept\n"
    assert not link.is_symlink() and link.read_bytes() == BODY
    assert [p.name for p in folder.iterdir()] == [link.name]


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_directory_at_the_path_is_refused_and_nothing_left(how: str, tmp_path: Path) -> None:
    """Held: a directory at the path is refused (``IsADirectoryError``), its contents and
    the folder untouched, no part file left."""
    folder = tmp_path / "export.jsonl"
    folder.mkdir()
    (folder / "inside").write_text("x")
    with pytest.raises(IsADirectoryError):
        _export_to(folder, how)
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]
    assert [p.name for p in folder.iterdir()] == ["inside"]


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_folder_it_cannot_write_is_refused_before_the_export(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held: a path in a folder that does not exist is refused before anything is asked
    of the server (the part file cannot be created)."""
    asked: list[bool] = []
    missing = tmp_path / "no" / "export.jsonl"
    with pytest.raises(FileNotFoundError):
        if how == "sync":
            with _sync_client(lambda: asked.append(True) or iter([BODY])) as client:
                client.audit_export_to(missing)
        else:

            async def run() -> None:
                async with _async_client(lambda: asked.append(True) or iter([BODY])) as c:
                    await c.audit_export_to(missing)

            asyncio.run(run())
    assert asked == []


# --- NJ at its edges (held) ------------------------------------------------------------------

LIMIT = 100


def _stdio_read(data: bytes) -> tuple[list[int], int]:
    """The lengths of the lines ``BoundedLines`` passes on from ``data`` (their newline
    included), and how many it refused."""

    async def run() -> tuple[list[int], int]:
        send, receive = anyio.create_memory_object_stream[object](1000)
        with send, receive:
            lines = BoundedLines(io.BytesIO(data), LIMIT)
            lines.answer_with(send)  # type: ignore[arg-type]
            passed = [len(line) async for line in lines]
            refused = 0
            while True:
                try:
                    receive.receive_nowait()
                except anyio.WouldBlock:
                    return passed, refused
                refused += 1

    return anyio.run(run)


@pytest.mark.parametrize(
    ("data", "passed", "refused"),
    [
        (b"a" * LIMIT + b"\nb\n", [LIMIT + 1, 2], 0),  # exactly at the limit: read
        (b"a" * (LIMIT + 1) + b"\nb\n", [2], 1),  # one past: refused, the next read
        (b"b\n" + b"a" * LIMIT, [2, LIMIT], 0),  # the last line unended, at the limit
        (b"b\n" + b"a" * (LIMIT + 1), [2], 1),  # ... one past it: refused at EOF
        (b"a" * LIMIT + b"\r\nb\n", [2], 1),  # the \r counts: it is the line's
        ((b"a" * LIMIT + b"\n") * 50, [LIMIT + 1] * 50, 0),  # many at the limit
        ((b"a" * (3 * LIMIT) + b"\n") * 5 + b"ok\n", [3], 5),  # many past, then one
        (b"", [], 0),
    ],
    ids=["at", "past", "eof-at", "eof-past", "crlf", "many-at", "many-past", "empty"],
)
def test_the_stdio_line_limit_at_its_edges(data: bytes, passed: list[int], refused: int) -> None:
    """Held (0182, NJ): the limit is the line's bytes without its ``\\n``, as HTTP's is
    the body's; a last line without a newline is read or refused alike; each refused
    line is answered once and the session goes on."""
    assert _stdio_read(data) == (passed, refused)


@pytest.mark.parametrize("how", ["sync", "async"])
@pytest.mark.parametrize(
    "name", ["e" * 249 + ".jsonl", "é" * 124 + ".jsonl"], ids=["ascii", "utf8"]
)
def test_an_export_to_a_name_near_the_longest_a_folder_takes(
    how: str, name: str, tmp_path: Path
) -> None:
    """Bug NU: 0179's part file is named ``.<name>.<8 hex>.part``, 15 bytes longer than
    the path's name: a name of 241 to 255 bytes, which ``open(path, "w")`` wrote before
    0179, failed with ``OSError`` (File name too long) before the export was asked for.
    The part's name is cut to fit; the path is the one given."""
    dest = tmp_path / name
    summary = _export_to(dest, how)
    assert getattr(summary, "entry_count", None) == 0
    assert dest.read_bytes() == BODY
    assert [p.name for p in tmp_path.iterdir()] == [name]
