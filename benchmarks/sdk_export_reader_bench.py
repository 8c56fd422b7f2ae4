"""Cost of the SDK's capped export readers (bug LG, review of 0169-small-leftovers).

``Client.audit_export_to`` and ``AsyncClient.audit_export_to`` (and ``audit_export``, which
holds the answer in memory: bugs NC, NE) over an in-process
``httpx.MockTransport`` streaming a synthetic JSONL trail (a header, ``LINES`` entry-sized
lines of ``WIDTH`` characters, a trailer) in ``CHUNK``-byte pieces, written to a file in
a temporary folder: what the readers themselves cost, without a server or a network.
Run from a tree's root to measure that tree's code:
``python -m benchmarks.sdk_export_reader_bench``.
"""

from __future__ import annotations

import asyncio
import base64
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from audit.canonical import canonical_bytes
from audit.export_format import EXPORT_FORMAT
from uprof.sdk import AsyncClient, Client

RUNS = 15
LINES = 20_000
WIDTH = 700
CHUNK = 65_536

# A frame as the exporter writes it (canonical header and trailer, entry lines starting
# as an entry's canonical JSON does): the readers read it as the verifier does (bug OF).
_HEADER = (
    canonical_bytes(
        {
            "checkpoint": "c",
            "exported_at": "2026-12-06T00:00:00.000000Z",
            "filter": {},
            "filtered": False,
            "format": EXPORT_FORMAT,
            "key_id": "k",
            "kind": "header",
            "note_key_id": "n",
            "origin": "o",
            "tree_size": LINES,
        }
    ).decode()
    + "\n"
)
_TRAILER = (
    canonical_bytes(
        {
            "entry_count": LINES,
            "export_sha256": "00" * 32,
            "kind": "trailer",
            "signature": base64.b64encode(bytes(64)).decode(),
        }
    ).decode()
    + "\n"
)
_ENTRY = '{"entry":' + "x" * (WIDTH - len('{"entry":')) + "\n"
_BODY = (_HEADER + _ENTRY * LINES + _TRAILER).encode()
_PIECES = [_BODY[i : i + CHUNK] for i in range(0, len(_BODY), CHUNK)]


class _Stream(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in _PIECES:
            yield piece


def _sync(path: Path) -> None:
    transport = httpx.MockTransport(lambda _r: httpx.Response(200, content=iter(_PIECES)))
    with Client("http://bench.invalid", "k", transport=transport) as client:
        client.audit_export_to(path)


def _sync_whole(path: Path) -> None:
    transport = httpx.MockTransport(lambda _r: httpx.Response(200, content=iter(_PIECES)))
    with Client("http://bench.invalid", "k", transport=transport) as client:
        client.audit_export()


def _async_whole(path: Path) -> None:
    async def run() -> None:
        transport = httpx.MockTransport(lambda _r: httpx.Response(200, stream=_Stream()))
        async with AsyncClient("http://bench.invalid", "k", transport=transport) as client:
            await client.audit_export()

    asyncio.run(run())


def _async(path: Path) -> None:
    async def run() -> None:
        transport = httpx.MockTransport(lambda _r: httpx.Response(200, stream=_Stream()))
        async with AsyncClient("http://bench.invalid", "k", transport=transport) as client:
            await client.audit_export_to(path)

    asyncio.run(run())


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trail.jsonl"
        for name, run in (
            ("sync audit_export_to", _sync),
            ("async audit_export_to", _async),
            ("sync audit_export", _sync_whole),
            ("async audit_export", _async_whole),
        ):
            times = []
            for _ in range(RUNS):
                start = time.perf_counter()
                run(path)
                times.append((time.perf_counter() - start) * 1e3)
            print(
                f"{name}, {len(_BODY) / 1e6:.1f} MB in {len(_PIECES)} chunks: "
                f"median {statistics.median(times):.1f} ms ({RUNS} runs)"
            )


if __name__ == "__main__":
    main()
