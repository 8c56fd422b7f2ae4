"""``audit_proof`` takes at most 16 MiB of its answer (bug OI, decision 0179's Left).

``send_for_bytes`` (``Client.audit_proof``, ``AsyncClient.audit_proof``) took the whole
answer (``response.content``), however long: a broken or hostile server streaming a
"proof document" without end took the caller's memory. A proof of any tree is a few
kilobytes and ``uprof audit verify-proof`` reads at most 16 MiB of one; the SDK now stops
one byte past that, with a ``TransportError`` naming the limit.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.api.conftest import AsyncCountedAnswer, CountedAnswer
from uprof.sdk import AsyncClient, Client, TransportError

#: The documented limit (docs/api.md), the CLI's for a proof document.
LIMIT = 16 * 1024 * 1024
CHUNK = 1 << 20


def _proof(size: int, how: str) -> tuple[bytes | BaseException, CountedAnswer]:
    answer = CountedAnswer(size, CHUNK)
    if how == "sync":

        def handle(request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, content=iter(answer))

        with Client("http://uprof.test", "k", transport=httpx.MockTransport(handle)) as client:
            try:
                return client.audit_proof(1), answer
            except TransportError as error:
                return error, answer

    def ahandle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=AsyncCountedAnswer(answer))

    async def run() -> bytes | BaseException:
        transport = httpx.MockTransport(ahandle)
        async with AsyncClient("http://uprof.test", "k", transport=transport) as client:
            try:
                return await client.audit_proof(1)
            except TransportError as error:
                return error

    return asyncio.run(run()), answer


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_proof_answer_over_the_limit_is_refused_as_it_arrives(how: str) -> None:
    """OI: 64 MiB is refused once past 16 MiB, naming the limit, having pulled at most a
    chunk more (on main: taken whole and returned)."""
    got, answer = _proof(4 * LIMIT, how)
    assert isinstance(got, TransportError), type(got)
    assert str(LIMIT) in str(got) and "audit_proof" in str(got), got
    assert answer.pulled <= LIMIT + CHUNK, answer.pulled


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_proof_answer_at_the_limit_is_returned_whole(how: str) -> None:
    """Held, the edge: exactly 16 MiB is the proof, byte for byte."""
    got, _ = _proof(LIMIT, how)
    assert isinstance(got, bytes) and len(got) == LIMIT and set(got) == {ord("x")}


@pytest.mark.parametrize("how", ["sync", "async"])
def test_an_error_answer_is_still_the_error_it_names(how: str) -> None:
    """Held: a 404 with the server's error body is still the SDK's error for it."""

    body = {"error": {"code": "not_found", "message": "no such tree", "details": []}}

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json=body)

    async def arun() -> None:
        transport = httpx.MockTransport(handle)
        async with AsyncClient("http://uprof.test", "k", transport=transport) as client:
            await client.audit_proof(1)

    with pytest.raises(Exception, match="no such tree") as raised:
        if how == "sync":
            with Client("http://uprof.test", "k", transport=httpx.MockTransport(handle)) as c:
                c.audit_proof(1)
        else:
            asyncio.run(arun())
    assert not isinstance(raised.value, TransportError), raised.value
