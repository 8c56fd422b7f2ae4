"""Review of decision 0148 (client retries) with real ``uprof serve`` processes.

A write is sent through a loopback proxy (``DroppingProxy`` of tests/api/
test_client_retries.py) to a server process; the answer is dropped after the commit and
the server is killed (SIGKILL), so the SDK's own resends find nothing listening. A new
server process on the same store then takes the caller's retry, as the docs tell it to.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest

from benchmarks.reliability import PLANNER, Target, grant_all, kernel_on, make_settings
from benchmarks.server_ready import stop_server
from tests.api.test_client_retries import DroppingProxy
from tests.children import PythonChild
from tests.reliability.test_group_commit_crash import _start_server
from uprof.sdk import Client, TransportError
from uprof.services.idempotency import idempotency_keys

WHEN = datetime(2025, 1, 1, 9, tzinfo=UTC)


class KillingProxy(DroppingProxy):
    """A ``DroppingProxy`` that kills the server when it drops an answer (the write is
    committed and answered, the answer never leaves), and can be pointed at the next
    server process (a connection it cannot forward, no server, is closed at once: the
    base proxy's own behaviour)."""

    def __init__(self, server: PythonChild, port: int) -> None:
        super().__init__(port)
        self.server = server

    def retarget(self, server: PythonChild, port: int) -> None:
        self.server, self._target = server, ("127.0.0.1", port)

    def _take_drop(self) -> bool:
        dropping = super()._take_drop()
        if dropping:
            self.server.send_signal(signal.SIGKILL)
            self.server.wait(30)
        return dropping


@pytest.fixture
def token(target: Target) -> str:
    from uprof.api import ApiKeyStore

    with kernel_on(target) as kernel:
        grant_all(kernel, "alice")
    keys = ApiKeyStore.open(make_settings(target))
    try:
        return keys.create(PLANNER).token
    finally:
        keys.close()


@contextmanager
def killed_after_commit(target: Target) -> Iterator[KillingProxy]:
    """A server process behind a proxy armed to drop the next answer and kill it; on
    exit every server process it served is stopped."""
    first, url = _start_server(target)
    servers = [first]
    try:
        with KillingProxy(first, int(url.rsplit(":", 1)[1])) as proxy:
            proxy.arm()
            yield proxy
            servers.append(proxy.server)
    finally:
        for server in servers:
            stop_server(server, timeout_s=30)


def restart(target: Target, proxy: KillingProxy) -> None:
    server, url = _start_server(target)
    proxy.retarget(server, int(url.rsplit(":", 1)[1]))


def kinds(target: Target) -> Counter[str]:
    with kernel_on(target) as kernel:
        notes = kernel.app.notifications_after(0, 100_000)
    return Counter(n.topic.rsplit(".", 1)[-1].rsplit(":", 1)[-1] for n in notes)


def test_a_capture_retried_after_the_server_was_killed_and_restarted_is_stored_once(
    target: Target, token: str
) -> None:
    """The SDK's resends (0.1 s and 0.2 s later) find no server; the caller gets
    ``TransportError`` and retries once the server is back. The error hands it the key
    the write was sent with, so its retry is the same write, stored once (bug JE)."""
    with killed_after_commit(target) as proxy:
        with Client(proxy.url, token) as client:
            with pytest.raises(TransportError) as failed:
                client.capture(
                    "alice", agent_id="agent:one", user_input="I like tea", occurred_at=WHEN
                )
            restart(target, proxy)
            key: Any = getattr(failed.value, "idempotency_key", None)
            again = client.capture(
                "alice",
                agent_id="agent:one",
                user_input="I like tea",
                occurred_at=WHEN,
                idempotency_key=key,
            )
    assert proxy.dropped == 1
    assert again.capture_id
    assert kinds(target)["InteractionCaptured"] == 1


def test_a_withdrawal_with_erase_resent_after_a_kill_before_its_answer_gets_a_receipt(
    target: Target, token: str
) -> None:
    """The server is killed after the withdrawal's erasure was written and before its
    answer was kept: the key is claimed, no answer stored (the state is set as the kill
    leaves it). The client's resend (same key) is the same request: it is answered with
    a receipt of that erasure, never with ``erasure: null`` ("nothing was collected")
    for captures that were erased (bug JF)."""
    server, url = _start_server(target)
    try:
        with Client(url, token) as client:
            consent_id = client.consents("alice")[0].consent_id
            client.capture("alice", agent_id="agent:one", user_input="I like tea", occurred_at=WHEN)
            first = client.withdraw_consent("alice", consent_id, erase=True, idempotency_key="w-1")
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait(30)
    assert first.erasure is not None and first.erasure.counts["captures"] == 1
    with kernel_on(target) as kernel:
        assert kernel.idempotency is not None
        with kernel.idempotency._engine.begin() as conn:
            t = idempotency_keys
            unanswered = conn.execute(
                t.update()
                .where(t.c.operation == "consent.withdraw")
                .values(state="pending", status=None, response=None)
            ).rowcount
    assert unanswered == 1
    server, url = _start_server(target)
    try:
        with Client(url, token) as client:
            again = client.withdraw_consent("alice", consent_id, erase=True, idempotency_key="w-1")
    finally:
        stop_server(server, timeout_s=30)
    assert again.consent.erase_requested
    assert again.erasure is not None, "a resend of an erasure that was done answered no receipt"
    body, first_body = again.erasure.receipt["body"], first.erasure.receipt["body"]
    assert isinstance(body, dict) and isinstance(first_body, dict)
    assert body["request"] == first_body["request"]  # the same request's erasure
    assert again.erasure.subject_nonce_hex != ""
    assert kinds(target)["CaptureErased"] == 1
