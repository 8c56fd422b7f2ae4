"""An error answer to an export or a proof request is read up to a bound (bug PE;
decision 0189's Left).

``stream_text`` (``audit_export``, ``audit_export_to``, sync and async) read the body of
an answer of status 400 or more whole (``response.read()``) before reading the error in
it: a broken or hostile server answering 500 with a body without end took the caller's
memory. ``send_for_bytes`` (``audit_proof``) took up to 16 MiB of one, the proof
document's limit, and said a proof document was too long. An error body is a small JSON
object; now at most ``MAX_ERROR_BODY_BYTES`` of it is taken, and one byte more is a
``TransportError`` naming the call, the status and the limit, the stream closed at once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import AsyncCountedAnswer, CountedAnswer
from uprof.sdk import AsyncClient, Client, ServiceUnavailableError, TransportError

#: The documented bound of an error answer's body (docs/api.md).
LIMIT = 1024 * 1024
CHUNK = 64 * 1024
CALLS = ["audit_export", "audit_export_to", "audit_proof"]


def _ask(client: Any, call: str, folder: Path) -> Any:
    if call == "audit_export":
        return client.audit_export()
    if call == "audit_export_to":
        return client.audit_export_to(folder / "trail.jsonl")
    return client.audit_proof(1)


def _answered(
    status: int, body: bytes | CountedAnswer, how: str, call: str, folder: Path
) -> BaseException | object:
    """What ``call`` of the sync or async client returns, or raises, for the answer."""
    headers = {"Retry-After": "7"}

    def handle(request: httpx.Request) -> httpx.Response:
        if isinstance(body, bytes):
            return httpx.Response(status, headers=headers, content=body)
        if how == "sync":
            return httpx.Response(status, headers=headers, content=iter(body))
        return httpx.Response(status, headers=headers, stream=AsyncCountedAnswer(body))

    transport = httpx.MockTransport(handle)
    if how == "sync":
        with Client("http://uprof.test", "k", transport=transport) as client:
            try:
                return _ask(client, call, folder)
            except Exception as error:
                return error

    async def run() -> BaseException | object:
        async with AsyncClient("http://uprof.test", "k", transport=transport) as client:
            try:
                return await _ask(client, call, folder)
            except Exception as error:
                return error

    return asyncio.run(run())


@pytest.mark.parametrize("how", ["sync", "async"])
@pytest.mark.parametrize("call", CALLS)
def test_an_endless_error_answer_is_refused_as_it_arrives(
    how: str, call: str, tmp_path: Path
) -> None:
    """PE: 64 MiB answered with status 500 is refused past the bound, naming the call,
    the status and the bound, having pulled at most a chunk more (on main: the export's
    read whole, then a ServerError; the proof's taken to 16 MiB)."""
    answer = CountedAnswer(64 * LIMIT, CHUNK)
    got = _answered(500, answer, how, call, tmp_path)
    assert isinstance(got, TransportError), repr(got)
    said = str(got)
    assert call.removesuffix("_to") in said and "500" in said and str(LIMIT) in said, said
    assert "error" in said, said
    assert answer.pulled <= LIMIT + CHUNK, answer.pulled
    assert not (tmp_path / "trail.jsonl").exists()


@pytest.mark.parametrize("how", ["sync", "async"])
@pytest.mark.parametrize("call", CALLS)
def test_an_error_answer_at_the_bound_is_still_the_error_it_names(
    how: str, call: str, tmp_path: Path
) -> None:
    """Held, the edge, and the error's wait: an error body of exactly the bound (the
    server's JSON, padded with blanks) is the SDK's error for it, with its Retry-After."""
    body = b'{"error": {"code": "store_unavailable", "message": "no store", "details": []}}'
    padded = body + b" " * (LIMIT - len(body))
    got = _answered(503, padded, how, call, tmp_path)
    assert isinstance(got, ServiceUnavailableError), repr(got)
    assert "no store" in str(got) and got.retry_after_s == 7, got
