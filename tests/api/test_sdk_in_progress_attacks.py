"""Review of 0159-turn-locks: the SDK's wait on 409 ``request_in_progress`` (bug KE) against
a hostile or broken server. Whatever its Retry-After says (huge, negative, not a number,
an HTTP-date), each pause stays within 0 and 30 s and the call is sent at most
``1 + in_progress_resends`` times, then raises ``ConflictError``; a call whose operation
takes no key is never sent again; the async client waits without blocking its loop."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from uprof.sdk import AsyncClient, Client, ConflictError

IN_PROGRESS = {"error": {"code": "request_in_progress", "message": "still running"}}


def refusing(retry_after: str, sent: list[httpx.Request]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(409, json=IN_PROGRESS, headers={"Retry-After": retry_after})

    return httpx.MockTransport(handle)


@pytest.mark.parametrize(
    "retry_after", ["99999", "inf", "-5", "nan", "soon", "Wed, 21 Oct 2099 07:28:00 GMT"]
)
def test_a_hostile_retry_after_is_bounded(
    retry_after: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pauses: list[float] = []
    monkeypatch.setattr(time, "sleep", pauses.append)
    sent: list[httpx.Request] = []
    client = Client(
        "http://uprof.test", "k", transport=refusing(retry_after, sent), in_progress_resends=3
    )
    with pytest.raises(ConflictError) as refused:
        client.withdraw_consent("alice", "c-1", erase=True, idempotency_key="w-1")
    assert refused.value.code == "request_in_progress"
    assert len(sent) == 4  # the first send and 3 resends, no more
    assert {r.headers["Idempotency-Key"] for r in sent} == {"w-1"}  # the same key each time
    assert len(pauses) == 3 and all(0.0 <= p <= 30.0 for p in pauses), pauses


def test_a_call_without_a_key_is_not_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "sleep", lambda _s: None)
    sent: list[httpx.Request] = []
    client = Client("http://uprof.test", "k", transport=refusing("1", sent))
    with pytest.raises(ConflictError):
        client.profile("alice")  # a read: no key, never resent
    assert len(sent) == 1


def test_the_async_client_waits_without_blocking_its_loop() -> None:
    sent: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(409, json=IN_PROGRESS, headers={"Retry-After": "0.3"})

    async def scenario() -> int:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1

        ticker = asyncio.create_task(tick())
        client = AsyncClient(
            "http://uprof.test",
            "k",
            transport=httpx.MockTransport(handle),
            in_progress_resends=2,
        )
        try:
            with pytest.raises(ConflictError):
                await client.withdraw_consent("alice", "c-1", idempotency_key="w-1")
        finally:
            ticker.cancel()
        return ticks

    ticks = asyncio.run(scenario())
    assert len(sent) == 3
    assert ticks >= 10, ticks  # 0.6 s of waits: the loop ran on meanwhile
