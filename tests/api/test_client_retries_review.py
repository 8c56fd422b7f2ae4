"""Review of decision 0148: the SDK's resends against a write still being processed.

The first request is held inside the server (its write waits until the resend has
arrived); the client's read timeout fires, and it sends the same request again with the
same key while the first is still running.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from tests.api.conftest import Apps, LiveServer, grant
from tests.api.test_client_retries import stored
from uprof.kernel import Uprof
from uprof.sdk import AsyncClient, Client, TransportError

WHEN = datetime(2025, 1, 1, 9, tzinfo=UTC)


def held_until_resent(owner: Any, name: str) -> list[int]:
    """Make ``owner.name`` hold its first call until a second call (the resend) begins;
    returns the list of calls made (for the test to count)."""
    real: Callable[..., Any] = getattr(owner, name)
    resent = threading.Event()
    calls: list[int] = []

    def held(*args: Any, **kwargs: Any) -> Any:
        calls.append(len(calls))
        if len(calls) == 1:
            assert resent.wait(60), "the client never sent the request again"
        else:
            resent.set()
        return real(*args, **kwargs)

    setattr(owner, name, held)
    return calls


def test_a_capture_resent_while_the_first_is_still_written_is_stored_once(
    server: LiveServer, kernel: Uprof, apps: Apps, http: httpx.Client
) -> None:
    """Both requests run the write with one key; the subject's stream lets one write, and
    the caller gets the capture that was stored."""
    grant(http, apps.planner)
    calls = held_until_resent(kernel, "capture_many")
    with Client(server.url, apps.planner, timeout_s=1.0) as client:
        ack = client.capture("alice", agent_id="agent:one", user_input="I like tea")
    kernel.process()
    assert len(calls) >= 2
    assert stored(kernel)["InteractionCaptured"] == 1
    ids = [c.capture_id for c in kernel.queries.all_captures(str(kernel.stream_of("alice")))]
    assert ids == [ack.capture_id]


def _refused_url() -> str:
    """A loopback address where nothing listens (bound, never listening, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_every_failed_write_names_its_key_and_a_read_none() -> None:
    """Sync and async clients: a write's ``TransportError`` names the key it was sent
    with (the caller's, or the one made for the call), a read's names none (bug JE)."""
    url = _refused_url()
    with Client(url, "k", write_retries=0) as client:
        with pytest.raises(TransportError) as made:
            client.capture("alice", agent_id="agent:one", user_input="x")
        with pytest.raises(TransportError) as given:
            client.grant_consent(
                "alice", categories=["*"], purposes=["p"], collected_by="ui", idempotency_key="g-1"
            )
        with pytest.raises(TransportError) as read:
            client.consents("alice")

    async def scenario() -> tuple[Any, Any]:
        async with AsyncClient(url, "k", write_retries=0) as aclient:
            try:
                await aclient.capture_many(
                    "alice", [{"agent_id": "a:1", "user_input": "x", "occurred_at": WHEN}]
                )
            except TransportError as error:
                batch = error
            try:
                await aclient.consents("alice")
            except TransportError as error:
                return batch, error
        raise AssertionError("no TransportError")

    batch, async_read = asyncio.run(scenario())
    assert (made.value.idempotency_key or "").startswith("uprof-sdk-")
    assert given.value.idempotency_key == "g-1"
    assert (batch.idempotency_key or "").startswith("uprof-sdk-")
    assert read.value.idempotency_key is None and async_read.idempotency_key is None


def test_a_kept_withdrawal_answer_replayed_signs_no_second_receipt(
    server: LiveServer, kernel: Uprof, apps: Apps, http: httpx.Client
) -> None:
    """JF's receipt issued again is only for a request whose answer was never kept: a
    replay of a kept answer returns that answer and signs nothing."""
    from audit.receipts import RECEIPT_ACTION

    consent_id = grant(http, apps.planner)
    with Client(server.url, apps.planner) as client:
        client.capture("alice", agent_id="agent:one", user_input="I like tea", occurred_at=WHEN)
        first = client.withdraw_consent("alice", consent_id, erase=True, idempotency_key="w-1")
        again = client.withdraw_consent("alice", consent_id, erase=True, idempotency_key="w-1")
    assert first.erasure is not None and again.erasure is not None
    assert again.erasure.receipt == first.erasure.receipt
    assert len(list(kernel.audit_log.entries(action=RECEIPT_ACTION))) == 1
