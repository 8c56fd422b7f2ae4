"""Outages seen through every door (decision 0182's Left), on SQLite and PostgreSQL:
each test failed on main before its fix, or says it held.

- OK: MCP tools and the embedded SDK during a database outage. REST answers the driver's
  "did not answer" as 503 ``store_unavailable`` (0182, NH); the MCP tools let it escape,
  which the MCP SDK answers as a crash ("Error executing tool <name>", nothing an agent
  can act on), the MCP HTTP transport's key check let it reach the server (a bare 500),
  and the embedded SDK raised SQLAlchemy's own ``OperationalError``.
- OL: a slice during a policy-store outage was 200 with every item withheld "by policy":
  an agent could not tell the outage from a profile with nothing to say.

The outage is real (``tests.conftest.database_down``): on PostgreSQL the test's database
refuses new connections and its open ones are ended; on SQLite the key store cannot be
opened, an outage by decision 0184's rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime
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
from uprof.api.runtime import ServiceRuntime
from uprof.eventstore import CAPTURED_TOPIC
from uprof.kernel import Uprof
from uprof.mcp import build_server
from uprof.mcp.server import http_app
from uprof.sdk import Client, ServiceUnavailableError

WHEN = datetime(2025, 1, 1, 9, tzinfo=UTC)
SLICE = {
    "query": "what do I eat?",
    "agent_id": "agent:one",
    "purpose": "personalization",
    "budget_tokens": 512,
}


@contextlib.contextmanager
def policy_answers_from_its_last_look(kernel: Uprof) -> Iterator[None]:
    """The policy's clock stopped just after a look at its store, so it decides from
    that look throughout (as any request within ``policy_refresh_s`` of the last look
    does): the request reaches the database instead of the policy's own look, which on
    PostgreSQL waits ~22 s and denies (0182's NK)."""
    authorizer = kernel.authorizer
    real = authorizer.monotonic
    assert kernel.policy_health() == ""
    stopped = real()
    authorizer.monotonic = lambda: stopped
    try:
        yield
    finally:
        authorizer.monotonic = real


def _captures(kernel: Uprof) -> int:
    return len(kernel.app.notifications_after(0, 100_000, [CAPTURED_TOPIC]))


def _tool_error(result: Any) -> dict[str, Any]:
    assert result.is_error, result
    text = " ".join(getattr(block, "text", "") for block in result.content)
    try:
        body = json.loads(text)
    except ValueError:
        pytest.fail(f"not the REST error body: {text!r}")
    return dict(body["error"])


MCP_CAPTURE = {
    "subject": "alice",
    "agent_id": "agent:one",
    "user_input": "I am vegetarian",
    "occurred_at": WHEN.isoformat(),
    "idempotency_key": "outage-1",
}


def test_mcp_tools_answer_a_database_outage_as_store_unavailable(
    kernel: Uprof, backend: Backend
) -> None:
    """Bug OK, MCP: a capture (its key is the retry's) and a slice during the outage are
    tool errors whose text is REST's 503 body, ``store_unavailable``; nothing is written,
    and the same capture sent again after the outage is stored once."""
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    before = _captures(kernel)

    async def scenario(server: Any) -> tuple[Any, Any, Any, Any]:
        async with McpClient(server) as client:
            with policy_answers_from_its_last_look(kernel):
                with database_down(backend, kernel.settings.key_path, kernel.keys_engine):
                    captured = await client.call_tool("capture", MCP_CAPTURE)
                    # A subject this process never looked up: read from the key store.
                    sliced = await client.call_tool("profile_slice", {"subject": "carol", **SLICE})
                    during = _captures(kernel) if backend.kind == "sqlite" else before
            again = await client.call_tool("capture", MCP_CAPTURE)
            resent = await client.call_tool("capture", MCP_CAPTURE)
            return captured, sliced, (during, again), resent

    with planner_mcp_server(kernel) as server:
        captured, sliced, (during, again), resent = asyncio.run(scenario(server))
    for refused in (captured, sliced):
        error = _tool_error(refused)
        assert error["code"] == "store_unavailable", error
        assert "did not answer" in error["message"]
    assert during == before
    assert not again.is_error, again
    assert not resent.is_error and resent.structured_content == again.structured_content
    assert _captures(kernel) == before + 1


def test_the_embedded_sdk_answers_a_database_outage_as_store_unavailable(
    kernel: Uprof, backend: Backend
) -> None:
    """Bug OK, embedded SDK: SQLAlchemy's ``OperationalError`` escaped the client. Now
    ``ServiceUnavailableError``, code ``store_unavailable``, with the wait REST sends as
    ``Retry-After``; the keyed capture sent again after the outage is stored once."""
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    before = _captures(kernel)
    refused: list[ServiceUnavailableError] = []
    with Client.embedded(kernel, PLANNER) as sdk:

        def capture() -> Any:
            return sdk.capture(
                "alice",
                agent_id="agent:one",
                user_input="I am vegetarian",
                occurred_at=WHEN,
                idempotency_key="outage-2",
            )

        with (
            policy_answers_from_its_last_look(kernel),
            database_down(backend, kernel.settings.key_path, kernel.keys_engine),
        ):
            for attempt in (capture, lambda: sdk.slice("carol", **SLICE)):
                with pytest.raises(ServiceUnavailableError) as unavailable:
                    attempt()
                refused.append(unavailable.value)
        first = capture()
        assert capture() == first
    for error in refused:
        assert error.code == "store_unavailable" and error.status == 503, error
        assert error.retry_after_s is not None and error.retry_after_s > 0
        assert error.__cause__ is None  # the driver's text (its parameters) not carried
    assert _captures(kernel) == before + 1


def test_the_mcp_http_transport_answers_a_key_check_during_an_outage_with_503(
    kernel: Uprof, keys: ApiKeyStore, apps: Apps, backend: Backend
) -> None:
    """Bug OK, MCP over HTTP: the bearer check reads the key's row; with the database
    down the driver's error went through the MCP SDK's middleware to the server (a bare
    500, or, in process, the error itself). Now REST's 503 ``store_unavailable`` with
    ``Retry-After``, before the SDK sees the request."""
    runtime = ServiceRuntime.for_kernel(kernel)
    app = http_app(build_server(runtime, api_keys=keys))
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }

    async def ask() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await client.post(
                "/mcp",
                json=initialize,
                headers={
                    **bearer(apps.planner),
                    "Accept": "application/json, text/event-stream",
                },
            )

    with database_down(backend, kernel.settings.key_path, kernel.keys_engine, keys._engine):
        answer = asyncio.run(ask())
    assert answer.status_code == 503, answer.text[:300]
    assert int(answer.headers["Retry-After"]) > 0
    assert answer.json()["error"]["code"] == "store_unavailable"


# --- OL: a slice during a policy-store outage ----------------------------------------------------


def test_a_slice_during_a_policy_store_outage_says_so_on_every_door(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof, backend: Backend
) -> None:
    """Bug OL: with the policy store unreadable every category is denied, and a slice was
    200 with nothing in it ("withheld: policy"), whether the profile held something the
    policy allows or nothing at all: an agent could not tell the outage from an empty
    profile. Fail closed, and say so: REST 503 ``policy_store_unavailable`` with
    ``Retry-After``, the same body as an MCP tool error and as the SDK's
    ``ServiceUnavailableError``. The subject's item (diet, which the planner may read) is
    served before and after the outage; nothing is recorded as served during it."""
    grant(http, apps.planner)
    told = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I am vegetarian")},
    )
    assert told.status_code == 201, told.text
    assert kernel.wait_until_caught_up(30)
    body = {"subject": "alice", **SLICE}
    served = http.post("/v1/slices", headers=bearer(apps.planner), json=body)
    assert served.status_code == 200 and "vegetarian" in served.text, served.text[:300]

    async def by_mcp(mcp: Any) -> Any:
        async with McpClient(mcp) as client:
            return await client.call_tool("profile_slice", body)

    with (
        planner_mcp_server(kernel) as mcp,
        Client.embedded(kernel, PLANNER) as sdk,
        policy_store_down(backend, kernel),
    ):
        kernel.reads.drain()
        recorded = kernel.audit_log.size()
        rest = http.post("/v1/slices", headers=bearer(apps.planner), json=body)
        tool = asyncio.run(by_mcp(mcp))
        with pytest.raises(ServiceUnavailableError) as embedded:
            sdk.slice(**body)
        kernel.reads.drain()
        assert kernel.audit_log.size() == recorded  # nothing served, nothing recorded
    assert rest.status_code == 503, rest.text[:300]
    assert int(rest.headers["Retry-After"]) > 0
    assert rest.json()["error"]["code"] == "policy_store_unavailable"
    assert "policy store unreadable" in rest.json()["error"]["message"]
    assert _tool_error(tool)["code"] == "policy_store_unavailable"
    assert embedded.value.code == "policy_store_unavailable"
    assert embedded.value.retry_after_s is not None and embedded.value.retry_after_s > 0
    again = http.post("/v1/slices", headers=bearer(apps.planner), json=body)
    assert again.status_code == 200 and "vegetarian" in again.text, again.text[:300]


def test_a_slice_of_a_profile_the_policy_withholds_is_still_200(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    """Held: a slice whose items the policy withholds (the store read, its answer "no":
    the planner may capture a location, not read one) is still 200 with the count
    withheld by policy: only the store not answering is refused."""
    grant(http, apps.planner)
    told = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I live in Lisbon")},
    )
    assert told.status_code == 201, told.text
    assert kernel.wait_until_caught_up(30)
    served = http.post(
        "/v1/slices",
        headers=bearer(apps.planner),
        json={"subject": "alice", **SLICE, "query": "where do I live?"},
    )
    assert served.status_code == 200, served.text[:300]
    assert "Lisbon" not in served.text
    assert served.json()["withheld"].get("policy", 0) >= 1
