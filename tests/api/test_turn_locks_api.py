"""Bugs KD and KE at the edge, against a real server (uvicorn on loopback).

KD: on PostgreSQL the key's turn (decision 0158) was a session advisory lock on a
connection of the views engine's pool (5 + 10 overflow), held for the whole erasure, and
the erasure takes its own connections from that pool: more keyed erasing withdrawals at
once than the pool holds starved each other. Now the turns take their connections from
an engine of their own (decision 0159-turn-locks).

KE: the SDK raised ``ConflictError(code="request_in_progress")`` where waiting the
server's Retry-After and sending the same key again replays the first answer; it now
waits (bounded) and resends through the one retry policy."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx

from tests.api.conftest import (
    LOOPBACK_TLS,
    PLANNER,
    Apps,
    LiveServer,
    bearer,
    grant,
    interaction,
)
from uprof.backends import backend_for
from uprof.kernel import Uprof
from uprof.sdk import AsyncClient, Client

#: More keyed erasing withdrawals at once than the views pool holds (5 + 10).
CONCURRENT = 20


def test_many_keyed_erasing_withdrawals_at_once_all_answer(
    server: LiveServer, http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    subjects = [f"user{i}" for i in range(CONCURRENT)]
    consents = {}
    for subject in subjects:
        consents[subject] = grant(http, apps.planner, subject=subject)
        capture = {"subject": subject, **interaction(f"{subject} likes sailing", ref=subject)}
        answer = http.post("/v1/captures", headers=bearer(apps.planner), json=capture)
        assert answer.status_code == 201, answer.text
    start = threading.Barrier(CONCURRENT)

    def withdraw(subject: str) -> tuple[int, str]:
        body = {"subject": subject, "consent_id": consents[subject], "erase": True}
        headers = bearer(apps.planner) | {"Idempotency-Key": f"withdraw-{subject}"}
        with httpx.Client(base_url=server.url, timeout=180, verify=LOOPBACK_TLS) as client:
            start.wait()
            response = client.post("/v1/consents/withdraw", headers=headers, json=body)
        return response.status_code, response.text

    with ThreadPoolExecutor(CONCURRENT) as pool:
        answers = list(pool.map(withdraw, subjects))
    failed = [(s, a) for s, a in zip(subjects, answers, strict=True) if a[0] != 200]
    assert not failed, failed
    for subject in subjects:
        assert all(c.withdrawn_at is not None for c in kernel.profile(subject).consents)


@contextmanager
def turn_held_until_refused(kernel: Uprof, key: str) -> Iterator[threading.Event]:
    """Hold ``key``'s turn (as a first request still erasing holds it) in another thread
    until the test sets the event it yields; the server waits only 0.2 s for it."""
    store = kernel.idempotency
    assert store is not None
    store.in_progress_wait_s = 0.2
    name = store.turn_name(store.token(PLANNER, key))
    engine = kernel.views_engine
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with backend_for(engine).named_lock(engine, name, wait_s=0) as got:
            assert got
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(30)
    try:
        yield release
    finally:
        release.set()
        holder.join(60)


def released_after_first_refusal(server: LiveServer, release: threading.Event) -> Any:
    """An httpx event hook: the first 409 ``request_in_progress`` answered frees the turn,
    so the SDK's resend (after Retry-After) finds the first request done."""

    def on_response(response: httpx.Response) -> None:
        if response.status_code == 409:
            release.set()

    return on_response


def test_the_sdk_waits_retry_after_and_resends_a_key_in_progress(
    server: LiveServer, http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    consent_id = grant(http, apps.planner)
    refusals: list[int] = []
    with turn_held_until_refused(kernel, "w-sdk") as release:
        with Client(server.url, apps.planner) as client:
            hook = released_after_first_refusal(server, release)
            client._backend._client.event_hooks["response"].append(  # type: ignore[attr-defined]
                lambda r: (refusals.append(r.status_code), hook(r))
            )
            answer = client.withdraw_consent(
                "alice", consent_id, erase=True, idempotency_key="w-sdk"
            )
    assert answer.consent.withdrawn_at is not None
    assert refusals == [409, 200], refusals


def test_the_async_sdk_waits_retry_after_and_resends_a_key_in_progress(
    server: LiveServer, http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    consent_id = grant(http, apps.planner)
    refusals: list[int] = []

    async def scenario(release: threading.Event) -> Any:
        async with AsyncClient(server.url, apps.planner) as client:

            async def on_response(response: httpx.Response) -> None:
                refusals.append(response.status_code)
                if response.status_code == 409:
                    release.set()

            client._backend._client.event_hooks["response"].append(on_response)  # type: ignore[attr-defined]
            return await client.withdraw_consent(
                "alice", consent_id, erase=True, idempotency_key="w-async"
            )

    with turn_held_until_refused(kernel, "w-async") as release:
        answer = asyncio.run(scenario(release))
    assert answer.consent.withdrawn_at is not None
    assert refusals == [409, 200], refusals
