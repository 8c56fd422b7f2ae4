"""A consent listing that waits for the subject's views is answered only if its key still
stands after the wait (SQLite and PostgreSQL).

``POST /v1/consents/list`` and the MCP ``forget`` tool's listing (with ``erase``) wait up to
``read_wait_timeout_s`` for the views. Decision 0106 made the whole-view reads ask the key
and the policy again after that wait; the consent listing was left (security.md, review of
0102): a key revoked during the wait still got the app's consent records, and ``forget``
went on to withdraw and erase with the revoked key. The listing is now decided again after
the wait (``Facade._decided_again``), as the profile reads are.

The wait is simulated as in ``test_profile_wait_revocation``: the kernel's freshness wait
revokes elsewhere and lets the server's read of the key row age past ``KEY_CACHE_TTL_S``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from mcp import Client

from tests.api.conftest import PLANNER, bearer, grant
from tests.api.test_mcp import error_code, text_of
from tests.api.test_profile_wait_revocation import during_the_wait
from tests.api.test_slice_wait_revocation import revoke_elsewhere
from uprof.api import ApiKeyStore
from uprof.api.runtime import ServiceRuntime
from uprof.apikeys.store import KEY_CACHE_TTL_S
from uprof.kernel import Uprof
from uprof.mcp import build_server
from uprof.settings import Settings


def test_a_key_revoked_during_the_wait_gets_no_consent_list(
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
    waited = during_the_wait(
        kernel, monkeypatch, revoke_elsewhere(settings, keys, issued.info.key_id, clock)
    )

    listed = http.post("/v1/consents/list", headers=bearer(issued.token), json={"subject": "alice"})

    assert waited == [True]
    assert listed.status_code == 401, listed.text
    assert listed.json()["error"]["code"] == "unauthenticated"
    assert consent_id not in listed.text


def test_a_live_key_gets_its_consent_list_after_the_wait(
    http: httpx.Client, kernel: Uprof, keys: ApiKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard: a key that still stands after a long wait is answered."""
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER)
    consent_id = grant(http, issued.token)

    def long_wait() -> None:
        clock[0] += KEY_CACHE_TTL_S + 0.1  # the row is read again after the wait

    waited = during_the_wait(kernel, monkeypatch, long_wait)
    listed = http.post("/v1/consents/list", headers=bearer(issued.token), json={"subject": "alice"})

    assert waited == [True]
    assert listed.status_code == 200, listed.text
    assert [c["consent_id"] for c in listed.json()["consents"]] == [consent_id]


def test_a_key_revoked_during_the_forget_listing_withdraws_nothing(
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MCP ``forget`` with ``erase`` lists the app's consents (waiting for the views) before
    it withdraws them: a key revoked during that wait is refused, and nothing is withdrawn
    or erased."""
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER)
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    principal = keys.authenticate(issued.token)
    assert principal is not None
    runtime = ServiceRuntime.for_kernel(kernel)
    server = build_server(
        runtime,
        stdio_principal=principal,
        stdio_check=lambda: keys.authenticate(issued.token),
    )
    waited = during_the_wait(
        kernel, monkeypatch, revoke_elsewhere(settings, keys, issued.info.key_id, clock)
    )

    async def scenario() -> Any:
        async with Client(server) as client:
            return await client.call_tool("forget", {"subject": "alice", "erase": True})

    runtime.start()
    try:
        result = asyncio.run(scenario())
    finally:
        runtime.stop()

    assert waited == [True]
    assert error_code(result) == "unauthenticated", text_of(result)
    actions = [e.entry["action"] for e in kernel.audit_log.entries()]
    assert not [a for a in actions if "withdraw" in a or "eras" in a], actions
