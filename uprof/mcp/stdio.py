"""MCP over stdio with a message size limit.

The SDK's stdio transport reads stdin a line at a time, each line one JSON-RPC message,
with no bound: a line of 1 GB (a host's bug, or a prompt-injected tool result copied
whole into a call) was read whole into memory before anything looked at it. Here a line
is read up to the limit the HTTP transport puts on a request body (``--max-body-bytes``,
1 MiB by default): a longer one is dropped as it is read, never held past the limit,
and answered with a JSON-RPC error (``INVALID_REQUEST``, id null: the message was not
read, so neither was its id) whose ``data`` is REST's ``payload_too_large`` body. The
session goes on with the next line.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, BinaryIO

import anyio
import anyio.to_thread
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp.types import INVALID_REQUEST, ErrorData, JSONRPCError

from uprof.api.errors import payload_too_large

#: Read and dropped at a time past the limit, until the line's end.
_DRAIN_CHUNK = 64 * 1024


class _Oversized:
    """A line read past the limit (and dropped)."""


_OVERSIZED = _Oversized()


class BoundedLines:
    """``source``'s lines as text, each at most ``limit`` bytes (its newline aside),
    for the SDK's stdio reader; a longer line is refused through ``answer``."""

    def __init__(self, source: BinaryIO, limit: int) -> None:
        self._source = source
        self._limit = limit
        self._replies: anyio.abc.ObjectSendStream[SessionMessage] | None = None
        self._ready = anyio.Event()

    def answer_with(self, replies: anyio.abc.ObjectSendStream[SessionMessage]) -> None:
        """Where refusals go: the transport's write stream (known once it is open)."""
        self._replies = replies
        self._ready.set()

    def __aiter__(self) -> BoundedLines:
        return self

    async def __anext__(self) -> str:
        while True:
            # In a worker thread, as the SDK reads stdin; abandoned when the session is
            # cancelled (the read blocks until the host writes or closes stdin).
            line = await anyio.to_thread.run_sync(self._read_line, abandon_on_cancel=True)
            if line is None:
                raise StopAsyncIteration
            if line is _OVERSIZED:
                await self._refuse()
                continue
            assert isinstance(line, bytes)
            return line.decode("utf-8", errors="replace")

    def _read_line(self) -> bytes | _Oversized | None:
        """The next line (None at end of input), reading at most ``limit`` + 1 bytes of
        it: past that, the rest of the line is read and dropped in small pieces."""
        line = self._source.readline(self._limit + 1)
        if not line:
            return None
        if len(line) <= self._limit or line.endswith(b"\n"):
            return line
        while True:
            rest = self._source.readline(_DRAIN_CHUNK)
            if not rest or rest.endswith(b"\n"):
                return _OVERSIZED

    async def _refuse(self) -> None:
        await self._ready.wait()
        assert self._replies is not None
        refused = payload_too_large(self._limit)
        error = JSONRPCError(
            jsonrpc="2.0",
            id=None,
            error=ErrorData(
                code=INVALID_REQUEST,
                message=f"payload_too_large: {refused.message}",
                data=refused.body().model_dump(mode="json"),
            ),
        )
        try:
            await self._replies.send(SessionMessage(error))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the session is ending: nobody is left to tell


@asynccontextmanager
async def bounded_stdio_server(
    max_message_bytes: int, source: BinaryIO | None = None
) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's stdio transport (its read and write streams), reading ``source``
    (stdin) through ``BoundedLines``."""
    lines = BoundedLines(source if source is not None else sys.stdin.buffer, max_message_bytes)
    async with stdio_server(stdin=lines) as (read_stream, write_stream):  # type: ignore[arg-type]
        lines.answer_with(write_stream)
        yield read_stream, write_stream
