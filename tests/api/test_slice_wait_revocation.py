"""A slice that waits for read-your-writes is served only if its key still stands then.

A slice may wait up to ``read_wait_timeout_s`` (30 s by default) for the views to pass the
subject's newest write. The key was checked only when the request came in: a key revoked
during the wait (``uprof apps revoke``, another process) still got the slice, over REST,
MCP and the SDK (found 2026-12-05). The key is now asked again after the wait, through the
server's row cache (``KEY_CACHE_TTL_S``), before anything is gated, served or recorded.

The wait is simulated: the kernel's freshness wait revokes the key elsewhere and lets the
server's read of the key row age past ``KEY_CACHE_TTL_S``, as a real wait that long does.
A role taken away during the wait needs nothing new: the policy is decided after the wait
(guard).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.api.conftest import PLANNER, LiveServer, bearer, grant, interaction
from tests.api.test_mcp import error_code, text_of
from tests.kernel.conftest import say
from uprof.api import ApiKeyStore
from uprof.api.runtime import ServiceRuntime
from uprof.apikeys.store import KEY_CACHE_TTL_S
from uprof.kernel import Uprof
from uprof.mcp import build_server
from uprof.settings import Settings

OPERATOR = "operator:test"
SLICE = {
    "subject": "alice",
    "query": "what do I drink?",
    "agent_id": "agent:one",
    "purpose": "personalization",
    "budget_tokens": 200,
}


def during_the_wait(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch, what: Callable[[], None]
) -> list[bool]:
    """Run ``what`` inside the slice's read-your-writes wait; returns a list of waits."""
    service = kernel.slice_service
    real = service._ensure_fresh
    waited: list[bool] = []

    def wait(*args: Any) -> Any:
        answer = real(*args)
        what()
        waited.append(True)
        return answer

    monkeypatch.setattr(service, "_ensure_fresh", wait)
    return waited


def revoke_elsewhere(
    settings: Settings, keys: ApiKeyStore, key_id: str, clock: list[float]
) -> Callable[[], None]:
    def revoke() -> None:
        elsewhere = ApiKeyStore.open(settings)  # `uprof apps revoke` in another process
        try:
            assert elsewhere.revoke(key_id)
        finally:
            elsewhere.close()
        clock[0] += KEY_CACHE_TTL_S + 0.1  # the wait outlived the server's read of the row

    return revoke


def served_slices(kernel: Uprof) -> int:
    return sum(1 for e in kernel.audit_entries(action="slice.served"))


def test_a_key_revoked_during_the_wait_gets_no_slice_over_rest(
    http: httpx.Client,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER)
    grant(http, issued.token)
    capture = {"subject": "alice", **interaction("I drink green tea")}
    assert http.post("/v1/captures", headers=bearer(issued.token), json=capture).status_code == 201
    before = served_slices(kernel)
    waited = during_the_wait(
        kernel, monkeypatch, revoke_elsewhere(settings, keys, issued.info.key_id, clock)
    )

    read = http.post("/v1/slices", headers=bearer(issued.token), json=SLICE)

    assert waited == [True]
    assert read.status_code == 401, read.text
    assert read.json()["error"]["code"] == "unauthenticated"
    assert "green tea" not in read.text
    assert served_slices(kernel) == before  # nothing served, nothing recorded as served


def test_a_key_revoked_during_the_wait_gets_no_slice_over_mcp(
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER)
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    # No worker runs here: projected now, the wait below still runs (and revokes) but
    # finds the views caught up instead of waiting out read_wait_timeout_s (10 s).
    kernel.process()
    principal = keys.authenticate(issued.token)
    assert principal is not None
    server = build_server(
        ServiceRuntime.for_kernel(kernel),
        stdio_principal=principal,
        stdio_check=lambda: keys.authenticate(issued.token),
    )
    waited = during_the_wait(
        kernel, monkeypatch, revoke_elsewhere(settings, keys, issued.info.key_id, clock)
    )

    async def scenario() -> Any:
        async with Client(server) as client:
            return await client.call_tool("profile_slice", SLICE)

    result = asyncio.run(scenario())

    assert waited == [True]
    assert error_code(result) == "unauthenticated", text_of(result)


def test_a_key_revoked_during_the_wait_gets_no_slice_over_mcp_streamable_http(
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MCP over streamable HTTP authenticates each request with its key and hands the
    slice the same check as REST (``key_still_live``); only stdio was tested until
    2026-12-05."""
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER)
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    kernel.capture("alice", say("I drink green tea", app=PLANNER))
    runtime = ServiceRuntime.for_kernel(kernel)
    app = build_server(runtime, keys).streamable_http_app(streamable_http_path="/mcp")
    before = served_slices(kernel)
    waited = during_the_wait(
        kernel, monkeypatch, revoke_elsewhere(settings, keys, issued.info.key_id, clock)
    )

    async def scenario(url: str) -> Any:
        http = create_mcp_http_client(headers=bearer(issued.token))
        async with http, Client(streamable_http_client(f"{url}/mcp", http_client=http)) as c:
            return await c.call_tool("profile_slice", SLICE)

    runtime.start()
    try:
        with LiveServer(app) as live:
            result = asyncio.run(scenario(live.url))
    finally:
        runtime.stop()

    assert waited == [True]
    assert error_code(result) == "unauthenticated", text_of(result)
    assert "green tea" not in text_of(result)
    assert served_slices(kernel) == before


def test_a_live_key_gets_its_slice_after_the_wait(
    http: httpx.Client, kernel: Uprof, keys: ApiKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER)
    grant(http, issued.token)

    def long_wait() -> None:
        clock[0] += KEY_CACHE_TTL_S + 0.1  # the row is read again after the wait

    waited = during_the_wait(kernel, monkeypatch, long_wait)
    read = http.post("/v1/slices", headers=bearer(issued.token), json=SLICE)

    assert waited == [True]
    assert read.status_code == 200, read.text


def test_a_role_taken_away_during_the_wait_withholds_everything(
    http: httpx.Client, kernel: Uprof, keys: ApiKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    issued = keys.create(PLANNER)
    grant(http, issued.token)
    capture = {"subject": "alice", **interaction("I drink green tea")}
    assert http.post("/v1/captures", headers=bearer(issued.token), json=capture).status_code == 201
    kernel.process()

    def revoke_role() -> None:
        kernel.policy_revoke(requested_by=OPERATOR, app_id=PLANNER, role="role:assistant")

    during_the_wait(kernel, monkeypatch, revoke_role)
    read = http.post("/v1/slices", headers=bearer(issued.token), json=SLICE)

    assert read.status_code == 200, read.text
    assert read.json()["items"] == []
    assert "green tea" not in read.json()["text"]
    assert set(read.json()["withheld"]) <= {"policy"}
