"""Review of decisions 0186 and 0188: a policy-store outage through every door that
consults the policy, on SQLite and PostgreSQL (the store's table renamed away, 0176's
stand-in, as ``policy_store_down``). Fail closed, and say so: no door may answer 200 with
something left out as if the policy had decided it, nor 500.

- OV: ``/v1/audit/key`` (and the SDK's ``audit_key``) left the checkpoint out while the
  policy could not be read, exactly as for a caller without the audit right: 200 with
  ``checkpoint: null``, which an auditor cannot tell from "not yours".
- Held: every other read and write that asks the policy refuses (403 naming the outage,
  as 0188 kept for ordinary decisions, or 503 ``policy_store_unavailable``), on REST, the
  MCP tools and the embedded SDK.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from mcp import Client as McpClient

from tests.api.conftest import (
    PLANNER,
    Apps,
    LiveServer,
    bearer,
    grant,
    interaction,
    planner_mcp_server,
)
from tests.conftest import Backend, database_down
from tests.web.conftest import policy_store_down
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.sdk import Client, ServiceUnavailableError

OUTAGE = "policy store unreadable"
SLICE = {
    "agent_id": "agent:one",
    "query": "what do I eat?",
    "purpose": "personalization",
    "budget_tokens": 300,
}


def _refused_for_the_outage(status: int, body: dict[str, Any], retry_after: str | None) -> None:
    """A refusal that says the policy store did not answer: 503 ``policy_store_unavailable``
    with a wait. Bug QL: ordinary decisions were 403 ``permission_denied`` naming the
    outage, without ``Retry-After`` (0188's choice), which an agent reads as a "no"."""
    error = body["error"]
    assert OUTAGE in error["message"], (status, body)
    assert (status, error["code"]) == (503, "policy_store_unavailable"), (status, body)
    assert int(retry_after or 0) > 0, (status, body)


def test_ov_the_audit_key_is_refused_while_the_policy_cannot_say_who_may_audit(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof, backend: Backend
) -> None:
    """Bug OV: during the outage an auditor (the operator key) was answered 200 with the
    key and ``checkpoint: null``, as a caller the policy denies ``audit``: the checkpoint
    it pins was silently withheld. Now 503 ``policy_store_unavailable`` with
    ``Retry-After``, to every caller (whether one may audit is not known), on REST and
    the embedded SDK; the checkpoint is back once the store answers."""
    auditor, app = bearer(apps.planner_operator), bearer(apps.planner)
    assert http.get("/v1/audit/key", headers=auditor).json()["checkpoint"]
    assert http.get("/v1/audit/key", headers=app).json()["checkpoint"] is None  # held
    with Client.embedded(kernel, PLANNER, roles=["app", "operator"]) as sdk:
        with policy_store_down(backend, kernel):
            answers = [http.get("/v1/audit/key", headers=h) for h in (auditor, app)]
            with pytest.raises(ServiceUnavailableError) as embedded:
                sdk.audit_key()
        assert sdk.audit_key().checkpoint
    for answer in answers:
        assert answer.status_code == 503, answer.text[:300]
        _refused_for_the_outage(
            answer.status_code, answer.json(), answer.headers.get("Retry-After")
        )
    assert embedded.value.code == "policy_store_unavailable"
    assert http.get("/v1/audit/key", headers=auditor).json()["checkpoint"]


#: (method, path, the operator's key?, body): every REST route whose answer the policy
#: decides, with a body it would accept (but ``/v1/audit/key``: OV's test).
POLICY_ROUTES: tuple[tuple[str, str, bool, dict[str, Any] | None], ...] = (
    ("POST", "/v1/captures", False, {"subject": "alice", **interaction("I like tea")}),
    ("POST", "/v1/captures/batch", False, {"subject": "alice", "interactions": [interaction("x")]}),
    ("POST", "/v1/slices", False, {"subject": "alice", **SLICE}),
    (
        "POST",
        "/v1/consents",
        False,
        {
            "subject": "alice",
            "categories": ["*"],
            "purposes": ["personalization"],
            "collected_by": "consent-ui:test",
        },
    ),
    ("POST", "/v1/profile/read", True, {"subject": "alice"}),
    ("POST", "/v1/memories/list", True, {"subject": "alice"}),
    ("POST", "/v1/evidence/read", True, {"subject": "alice", "item_id": "x"}),
    ("POST", "/v1/subjects/list", True, {}),
    ("GET", "/v1/policy", True, None),
    ("GET", "/v1/policy/history", True, None),
    ("POST", "/v1/audit/export", True, {}),
    ("POST", "/v1/audit/entries", True, {}),
    ("POST", "/v1/audit/receipts", True, {}),
    ("POST", "/v1/audit/proof", True, {"old_size": 1}),
    ("POST", "/v1/governance/exports", True, {"subject": "alice"}),
    ("POST", "/v1/governance/erasures/item", True, {"subject": "alice", "item_id": "x"}),
    ("POST", "/v1/governance/erasures/subject", True, {"subject": "alice"}),
    ("GET", "/v1/quarantine", True, None),
)


def test_every_rest_route_that_asks_the_policy_refuses_during_its_outage(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof, backend: Backend
) -> None:
    """During the outage each route the policy decides refuses naming it, 503 with a wait
    (bug QL: 403 for most; the audit key is OV's), none 200 or 500; nothing is captured
    meanwhile; each answers as before once the store is back (the slice serves alice's
    diet again)."""
    grant(http, apps.planner)
    told = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I am vegetarian")},
    )
    assert told.status_code == 201, told.text
    assert kernel.wait_until_caught_up(30)
    keys = {True: bearer(apps.planner_operator), False: bearer(apps.planner)}
    with policy_store_down(backend, kernel):
        log = len(kernel.app.notifications_after(0, 100_000))
        answers = [
            (path, http.request(method, path, headers=keys[operator], json=body))
            for method, path, operator, body in POLICY_ROUTES
        ]
        assert len(kernel.app.notifications_after(0, 100_000)) == log  # nothing written
        ready = http.get("/readyz")
    for path, answer in answers:
        assert answer.status_code == 503, (path, answer.text[:300])
        _refused_for_the_outage(
            answer.status_code, answer.json(), answer.headers.get("Retry-After")
        )
    assert ready.status_code == 503 and OUTAGE in ready.json()["detail"]
    served = http.post("/v1/slices", headers=keys[False], json={"subject": "alice", **SLICE})
    assert served.status_code == 200 and "vegetarian" in served.text, served.text[:300]


def test_ql_the_http_sdk_raises_the_outage_with_its_wait(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof, backend: Backend
) -> None:
    """Bug QL over HTTP: a capture and an export during the outage raised
    ``PermissionDeniedError``, which an app takes for a "no"; now
    ``ServiceUnavailableError`` ``policy_store_unavailable`` with ``retry_after_s``, raised
    (not sent again: the SDK resends only what got no answer) and nothing captured."""
    grant(http, apps.planner)
    with (
        Client(server.url, apps.planner) as app,
        Client(server.url, apps.privacy) as privacy,
        policy_store_down(backend, kernel),
    ):
        log = len(kernel.app.notifications_after(0, 100_000))
        for call in (
            lambda: app.capture("alice", agent_id="agent:one", user_input="I like tea"),
            lambda: privacy.export_subject("alice"),
        ):
            with pytest.raises(ServiceUnavailableError) as refused:
                call()
            assert refused.value.code == "policy_store_unavailable", refused.value
            assert refused.value.retry_after_s == 5, refused.value
        assert len(kernel.app.notifications_after(0, 100_000)) == log


def _tool_error(result: Any) -> tuple[int, dict[str, Any]]:
    """The REST status a tool error stands for (by its code) and its body."""
    assert result.is_error, result
    body = json.loads(" ".join(getattr(block, "text", "") for block in result.content))
    status = 503 if body["error"]["code"].endswith("_unavailable") else 403
    return status, body


def test_the_mcp_tools_and_the_embedded_sdk_refuse_during_the_outage(
    kernel: Uprof, backend: Backend
) -> None:
    """Over MCP the slice (tool and resource), a capture and an item's erasure are tool
    errors naming the outage, ``policy_store_unavailable``; the embedded SDK raises
    ``ServiceUnavailableError`` with that code and the wait for every call the policy
    decides (bug QL: ``PermissionDeniedError`` for most), and returns nothing."""
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    capture = {
        "subject": "alice",
        "agent_id": "agent:one",
        "user_input": "I like tea",
        "occurred_at": "2025-01-01T09:00:00+00:00",
    }

    async def by_mcp(server: Any) -> tuple[list[Any], str]:
        async with McpClient(server) as client:
            results = [
                await client.call_tool("profile_slice", {"subject": "alice", **SLICE}),
                await client.call_tool("capture", capture),
                await client.call_tool("forget", {"subject": "alice", "item_id": "x"}),
            ]
            try:
                await client.read_resource("uprof://profile/alice")
            except Exception as refused:  # the SDK's protocol error: its message is the body
                return results, str(refused)
            return results, ""

    with planner_mcp_server(kernel) as server, policy_store_down(backend, kernel):
        tools, resource = asyncio.run(by_mcp(server))
    for result in tools:
        status, body = _tool_error(result)
        _refused_for_the_outage(status, body, "5")
    assert OUTAGE in resource, resource

    calls: list[Callable[[Client], Any]] = [
        lambda c: c.slice("alice", **SLICE),
        lambda c: c.capture(
            "alice", agent_id="agent:one", user_input="tea", occurred_at=capture["occurred_at"]
        ),
        lambda c: c.profile("alice"),
        lambda c: c.list_memories("alice"),
        lambda c: c.list_subjects(),
        lambda c: c.audit_entries(),
        lambda c: c.audit_receipts(),
        lambda c: c.export_subject("alice"),
        lambda c: c.erase_subject("alice"),
    ]
    with (
        Client.embedded(kernel, PLANNER, roles=["app", "operator"]) as sdk,
        policy_store_down(backend, kernel),
    ):
        for call in calls:
            with pytest.raises(ServiceUnavailableError) as refused:
                call(sdk)
            assert OUTAGE in str(refused.value), refused.value
            assert refused.value.code == "policy_store_unavailable", refused.value
            assert (refused.value.retry_after_s or 0) > 0, refused.value


def test_a_withdrawal_needs_no_policy_and_goes_through_its_outage(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof, backend: Backend
) -> None:
    """Held: listing and withdrawing an app's own consent ask no policy (withdrawing only
    narrows what the app holds, docs/governance.md), so they answer during the outage;
    once the store is back the capture the withdrawn consent covered is refused."""
    consent_id = grant(http, apps.planner)
    app = bearer(apps.planner)
    with policy_store_down(backend, kernel):
        listed = http.post("/v1/consents/list", headers=app, json={"subject": "alice"})
        withdrawn = http.post(
            "/v1/consents/withdraw",
            headers=app,
            json={"subject": "alice", "consent_id": consent_id},
        )
    assert listed.status_code == 200, listed.text[:300]
    assert [c["consent_id"] for c in listed.json()["consents"]] == [consent_id]
    assert withdrawn.status_code == 200, withdrawn.text[:300]
    refused = http.post(
        "/v1/captures", headers=app, json={"subject": "alice", **interaction("I like tea")}
    )
    assert refused.status_code == 403, refused.text[:300]
    assert refused.json()["error"]["code"] == "consent_required"


def test_every_rest_route_that_asks_the_policy_refuses_while_the_database_is_down(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    keys: ApiKeyStore,
    backend: Backend,
) -> None:
    """Held: with the whole database down (PostgreSQL refusing connections; SQLite's key
    store unopenable, ``database_down``) the same routes, the audit key included, are
    refused as the outage they meet first: 503 ``store_unavailable`` or
    ``policy_store_unavailable`` with ``Retry-After``, or 403 naming the policy store;
    none 200, none 500. They answer again once the database is back."""
    grant(http, apps.planner)
    keyed = {True: bearer(apps.planner_operator), False: bearer(apps.planner)}
    routes = (*POLICY_ROUTES, ("GET", "/v1/audit/key", True, None))
    with database_down(backend, kernel.settings.key_path, kernel.keys_engine, keys._engine):
        answers = [
            (path, http.request(method, path, headers=keyed[operator], json=body))
            for method, path, operator, body in routes
        ]
    for path, answer in answers:
        shown = (path, answer.status_code, answer.text[:300])
        error = answer.json()["error"]
        if answer.status_code == 403:
            assert OUTAGE in error["message"], shown
        else:
            assert answer.status_code == 503, shown
            assert error["code"] in ("store_unavailable", "policy_store_unavailable"), shown
            assert int(answer.headers["Retry-After"]) > 0, shown
    # The policy's last failed look is remembered for its refresh interval (0188's OM):
    # the first requests after the outage may still be told to retry, as the caller is.
    for _ in range(60):
        back = http.get("/v1/audit/key", headers=keyed[True])
        if back.status_code != 503:
            break
        time.sleep(min(1.0, float(back.headers["Retry-After"])))
    assert back.status_code == 200 and back.json()["checkpoint"], back.text[:300]
