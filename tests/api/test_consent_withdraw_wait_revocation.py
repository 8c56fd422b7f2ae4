"""A withdrawal with ``erase`` that waits for the subject's views withdraws and erases
nothing if its key was revoked during the wait (SQLite and PostgreSQL).

Decision 0109 decided the consent *listing* again after its wait (``list_consents``).
``POST /v1/consents/withdraw`` with ``erase`` reads the app's consents through
``Facade.consents`` (the subject's profile view: a wait up to ``read_wait_timeout_s``)
before it withdraws and erases, and MCP ``forget`` with ``erase`` goes through the same
withdrawal for each consent it listed. Found in the review of 0108/0109: a key revoked
during that wait still withdrew the consent and erased what it collected (a signed
receipt under a key that no longer stood), and the REST answer read the consent back
for it. ``Facade.consents`` now asks again after its wait (``_decided_again``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from mcp import Client

from tests.api.conftest import PLANNER, bearer, grant, interaction
from tests.api.test_mcp import error_code, text_of
from tests.api.test_slice_wait_revocation import revoke_elsewhere
from uprof.api import ApiKeyStore
from uprof.api.runtime import ServiceRuntime
from uprof.kernel import Uprof
from uprof.mcp import build_server
from uprof.settings import Settings


def during_wait_number(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch, number: int, what: Callable[[], None]
) -> list[int]:
    """Run ``what`` once, inside the ``number``-th read-your-writes wait (1 = the first);
    returns the waits seen so far (a list, for the test to read afterwards)."""
    real = kernel.ensure_subject_fresh
    seen: list[int] = []

    def wait(*args: Any, **kwargs: Any) -> Any:
        answer = real(*args, **kwargs)
        seen.append(len(seen) + 1)
        if len(seen) == number:
            what()
        return answer

    monkeypatch.setattr(kernel, "ensure_subject_fresh", wait)
    return seen


def _collected(http: httpx.Client, kernel: Uprof, token: str) -> None:
    """One capture under the consent, in the views: a withdrawal with erase erases it."""
    captured = http.post(
        "/v1/captures",
        headers=bearer(token),
        json={"subject": "alice", **interaction("I live in Lisbon")},
    )
    assert captured.status_code == 201, captured.text
    assert kernel.wait_until_caught_up(30)


def _governed(kernel: Uprof) -> list[str]:
    return [
        a
        for a in (e.entry["action"] for e in kernel.audit_log.entries())
        if "withdraw" in a or "eras" in a or "receipt" in a
    ]


def test_a_key_revoked_during_the_wait_of_a_withdrawal_with_erase_erases_nothing(
    http: httpx.Client,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER)
    consent_id = grant(http, issued.token)
    _collected(http, kernel, issued.token)
    before = _governed(kernel)
    waits = during_wait_number(
        kernel, monkeypatch, 1, revoke_elsewhere(settings, keys, issued.info.key_id, clock)
    )

    withdrawn = http.post(
        "/v1/consents/withdraw",
        headers=bearer(issued.token),
        json={"subject": "alice", "consent_id": consent_id, "erase": True},
    )

    assert waits, "the withdrawal with erase waited for the views"
    assert withdrawn.status_code == 401, withdrawn.text
    assert withdrawn.json()["error"]["code"] == "unauthenticated"
    assert _governed(kernel) == before  # nothing withdrawn, nothing erased
    assert [c.consent_id for c in kernel.consents_in_force("alice")] == [consent_id]


def test_a_live_key_withdraws_with_erase_after_the_waits(
    http: httpx.Client, kernel: Uprof, keys: ApiKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard: the same withdrawal with a key that stands is answered with a receipt."""
    issued = keys.create(PLANNER)
    consent_id = grant(http, issued.token)
    _collected(http, kernel, issued.token)
    waits = during_wait_number(kernel, monkeypatch, 1, lambda: None)

    withdrawn = http.post(
        "/v1/consents/withdraw",
        headers=bearer(issued.token),
        json={"subject": "alice", "consent_id": consent_id, "erase": True},
    )

    assert waits
    assert withdrawn.status_code == 200, withdrawn.text
    assert withdrawn.json()["erasure"] is not None
    assert kernel.consents_in_force("alice") == []


@pytest.mark.parametrize("wait", [2, 3, 4])
def test_a_key_revoked_during_forgets_withdrawal_wait_erases_nothing(
    http: httpx.Client,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    wait: int,
) -> None:
    """MCP ``forget`` with ``erase``: its listing is decided again after the first wait
    (0109); the key revoked during a later one must stop it too: the app's consents read
    for the withdrawal (2), the door's (3), or the kernel's own wait after them (4;
    hostile callers round 9, bug QV: it withdrew and erased, with a receipt)."""
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER)
    grant(http, issued.token)
    _collected(http, kernel, issued.token)
    principal = keys.authenticate(issued.token)
    assert principal is not None
    runtime = ServiceRuntime.for_kernel(kernel)
    server = build_server(
        runtime,
        stdio_principal=principal,
        stdio_check=lambda: keys.authenticate(issued.token),
    )
    before = _governed(kernel)
    waits = during_wait_number(
        kernel, monkeypatch, wait, revoke_elsewhere(settings, keys, issued.info.key_id, clock)
    )

    async def scenario() -> Any:
        async with Client(server) as client:
            return await client.call_tool("forget", {"subject": "alice", "erase": True})

    runtime.start()
    try:
        result = asyncio.run(scenario())
    finally:
        runtime.stop()

    assert len(waits) >= wait, waits
    assert error_code(result) == "unauthenticated", text_of(result)
    assert _governed(kernel) == before
    assert len(kernel.consents_in_force("alice")) == 1
