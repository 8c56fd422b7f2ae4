"""The MCP tools and resource and the SDK as a hostile caller would use them.

Each test is a finding of the review of the non-REST surfaces (docs/security.md,
"Non-REST surfaces"): arguments the tools do not declare, malformed keys, a field named
``query``, and what a refused read of the profile resource leaves in the server's log.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx
import pytest
from mcp import Client as McpClient
from mcp.shared.exceptions import MCPError
from mcp.types import TextResourceContents

from domain.errors import InvalidInputError as DomainInvalidInput
from domain.principal import OPERATORS, RESERVED_APP_IDS
from tests.api.conftest import CALENDAR, PLANNER, WHEN, LiveServer, bearer
from tests.api.mcp_messages import ACCEPT, HELLO
from uprof.api import ApiKeyStore
from uprof.api.runtime import ServiceRuntime
from uprof.apikeys.store import Principal
from uprof.apikeys.tables import api_keys
from uprof.facade import Facade
from uprof.facade import Principal as FacadePrincipal
from uprof.kernel import Uprof
from uprof.mcp import build_server
from uprof.schemas import api as w
from uprof.sdk import APIError, Client, InvalidRequestError

CANARY = "canary-subject-5d1e@example.com"


def _text(result: Any) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content)


def _error(result: Any) -> dict[str, Any]:
    assert result.is_error, _text(result)
    return dict(json.loads(_text(result))["error"])


def _fields(result: Any) -> list[str]:
    return [f["field"] for f in _error(result)["fields"]]


def _planner(kernel: Uprof) -> tuple[ServiceRuntime, Any]:
    runtime = ServiceRuntime.for_kernel(kernel)
    runtime.start()
    return runtime, build_server(
        runtime, stdio_principal=Principal(PLANNER, "k", frozenset({"app"}))
    )


CAPTURE = {"subject": "alice", "agent_id": "agent:one", "user_input": "hi", "occurred_at": WHEN}
SLICE = {
    "subject": "alice",
    "query": "q",
    "agent_id": "agent:one",
    "purpose": "personalization",
    "budget_tokens": 100,
}


def test_an_argument_a_tool_does_not_declare_is_refused_and_nothing_is_written(
    kernel: Uprof,
) -> None:
    """An argument naming another app (or a role, or a field REST has but the tool has
    not) was dropped without a word and the capture written as the key's app: the caller
    believed it had written for ``app:calendar``. Now 422 naming the argument, as REST
    answers an unknown body field."""
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    runtime, server = _planner(kernel)
    before = kernel.lag().log_position

    async def calls() -> list[Any]:
        async with McpClient(server) as client:
            return [
                await client.call_tool("capture", {**CAPTURE, "app_id": CALENDAR}),
                await client.call_tool("capture", {**CAPTURE, "agent_type": "admin"}),
                await client.call_tool("profile_slice", {**SLICE, "roles": ["operator"]}),
                await client.call_tool("forget", {"subject": "alice", "principal": CALENDAR}),
            ]

    try:
        results = asyncio.run(calls())
    finally:
        runtime.stop()
    assert [_fields(r) for r in results] == [["app_id"], ["agent_type"], ["roles"], ["principal"]]
    assert {_error(r)["code"] for r in results} == {"invalid_request"}
    assert kernel.lag().log_position == before  # no capture, no withdrawal
    assert len(kernel.profile("alice").consents) == 1
    assert all(c.withdrawn_at is None for c in kernel.profile("alice").consents)


def test_a_malformed_idempotency_key_names_the_argument_and_writes_nothing(
    kernel: Uprof,
) -> None:
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    runtime, server = _planner(kernel)
    before = kernel.lag().log_position

    async def calls() -> list[Any]:
        async with McpClient(server) as client:
            return [
                await client.call_tool("capture", {**CAPTURE, "idempotency_key": key})
                for key in ("", "k" * 256, "a b", "a\x00b")
            ]

    try:
        results = asyncio.run(calls())
    finally:
        runtime.stop()
    assert [_fields(r) for r in results] == [["idempotency_key"]] * 4
    assert kernel.lag().log_position == before


def test_a_refused_query_is_named_query(kernel: Uprof) -> None:
    """A slice's ``query`` was reported as the field ``body`` outside REST: the error
    shaping dropped a leading "query" as if it were FastAPI's query-string part."""
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    runtime, server = _planner(kernel)
    too_long = "x" * (w.MAX_QUERY_CHARS + 1)

    async def calls() -> list[Any]:
        async with McpClient(server) as client:
            return [
                await client.call_tool("profile_slice", {**SLICE, "query": too_long}),
                await client.call_tool("profile_slice", {**SLICE, "query": 7}),
            ]

    try:
        results = asyncio.run(calls())
    finally:
        runtime.stop()
    assert [_fields(r) for r in results] == [["query"], ["query"]]

    client = Client.embedded(kernel, PLANNER)
    try:
        with pytest.raises(InvalidRequestError) as refused:
            client.slice(
                "alice",
                too_long,
                budget_tokens=100,
                purpose="personalization",
                agent_id="agent:one",
            )
    finally:
        client.close()
    assert [f.field for f in refused.value.fields] == ["query"]


def test_a_refused_profile_resource_leaves_no_subject_in_the_log(
    kernel: Uprof, caplog: pytest.LogCaptureFixture
) -> None:
    """Every refused read of ``uprof://profile/<subject>`` (an app with no consent of
    the subject, an unknown or erased subject, a revoked key) was logged at ERROR, with
    a traceback, as "Resource 'uprof://profile/<subject>' raised an unexpected
    exception": the subject reference in plaintext in the server's log, and the caller
    got a generic text instead of the REST error body. Now the REST body, the same for
    a subject the app holds no consent of and an unknown one, and nothing logged."""
    kernel.grant_consent(CANARY, app_id=CALENDAR, categories=["*"], purposes=["personalization"])
    served = "served-" + CANARY
    kernel.grant_consent(served, app_id=PLANNER, categories=["*"], purposes=["personalization"])
    runtime, server = _planner(kernel)

    async def served_read() -> str:
        async with McpClient(server) as client:
            result = await client.read_resource(f"uprof://profile/{served}")
        [content] = result.contents
        assert isinstance(content, TextResourceContents)
        return str(json.loads(content.text)["app_id"])

    async def read(subject: str) -> str:
        async with McpClient(server) as client:
            try:
                await client.read_resource(f"uprof://profile/{subject}")
            except MCPError as error:
                return error.error.message
        raise AssertionError("the read was served")

    caplog.set_level(logging.DEBUG)
    try:
        known = asyncio.run(read(CANARY))
        unknown = asyncio.run(read("nobody-" + CANARY))
        assert asyncio.run(served_read()) == PLANNER
    finally:
        runtime.stop()
    assert json.loads(known)["error"]["code"] == "subject_not_found"
    assert known == unknown
    logged = [r.getMessage() + str(r.exc_info or "") for r in caplog.records]
    assert not [line for line in logged if CANARY in line]


def test_another_apps_key_cannot_use_an_mcp_session(kernel: Uprof, keys: ApiKeyStore) -> None:
    """Held on 2026-12-04 (the MCP SDK binds a session to the key that opened it): a
    regression test, not a fix."""
    runtime = ServiceRuntime.for_kernel(kernel)
    app = build_server(runtime, keys).streamable_http_app(streamable_http_path="/mcp")
    planner, calendar = keys.create(PLANNER).token, keys.create(CALENDAR).token
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "profile_slice", "arguments": SLICE},
    }
    runtime.start()
    try:
        with LiveServer(app) as live:
            opened = httpx.post(
                f"{live.url}/mcp", json=HELLO, headers={**ACCEPT, **bearer(planner)}
            )
            assert opened.status_code == 200
            session = {"mcp-session-id": opened.headers["mcp-session-id"]}
            foreign = {**ACCEPT, **bearer(calendar), **session}
            used = httpx.post(f"{live.url}/mcp", json=call, headers=foreign)
            closed = httpx.delete(f"{live.url}/mcp", headers=foreign)
            own = httpx.post(
                f"{live.url}/mcp",
                json={"jsonrpc": "2.0", "id": 3, "method": "tools/list"},
                headers={**ACCEPT, **bearer(planner), **session},
            )
    finally:
        runtime.stop()
    assert (used.status_code, closed.status_code) == (404, 404)
    assert "alice" not in used.text
    assert own.status_code == 200 and "profile_slice" in own.text


def test_the_sdk_moves_only_an_intent_its_agent_may_see(kernel: Uprof) -> None:
    """The REST fix of 1ef8317 (intent updates bound in the door) reaches the embedded
    SDK, which calls the same ``AppScope``: held, a regression test."""
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    kernel.grant_consent("alice", app_id=CALENDAR, categories=["*"], purposes=["scheduling"])
    planner = Client.embedded(kernel, PLANNER)
    calendar = Client.embedded(kernel, CALENDAR)
    rogue = Client.embedded(kernel, "app:rogue")
    update = [{"kind": "intent_update", "description": "run a marathon", "status": "abandoned"}]
    try:
        ack = planner.capture("alice", agent_id="agent:one", user_input="hello there")
        planner.submit_proposals(
            "alice",
            [{"kind": "intent", "description": "run a marathon", "evidence": [ack.capture_id]}],
            agent_id="agent:one",
        )
        kernel.process()
        before = kernel.lag().log_position
        refusals = []
        for client, agent, purpose in (
            (planner, "agent:two", "personalization"),  # private to agent:one
            (calendar, "agent:one", "scheduling"),  # another app's agent:one
            (rogue, "agent:one", "personalization"),  # no role, no consent
        ):
            with pytest.raises(APIError) as refused:
                client.submit_proposals("alice", update, agent_id=agent, purpose=purpose)
            refusals.append(refused.value.code)
    finally:
        for client in (planner, calendar, rogue):
            client.close()
    # An intent the agent may not see is one that does not exist (``intent_not_found``,
    # since 0209's Left); an app holding no consent of alice learns nothing of her.
    assert refusals == ["intent_not_found", "intent_not_found", "subject_not_found"]
    [goal] = kernel.profile("alice").intents
    assert goal.status == "active"
    assert kernel.lag().log_position == before


def test_no_key_is_issued_for_an_app_named_operators(kernel: Uprof, keys: ApiKeyStore) -> None:
    """``operators`` is the policy's name for operators, and it passed the app-id check:
    ``uprof apps create operators`` issued a key that the policy decided with the
    operators' rows (erase, export, audit) although it had no operator role; with
    ``--read`` it first granted those rules to every operator."""
    with pytest.raises(DomainInvalidInput, match="app_id"):
        keys.create(OPERATORS)
    operator = Facade(kernel, FacadePrincipal.local_operator(kernel.subjects.tenant))
    version = len(operator.policy_history())
    with pytest.raises(DomainInvalidInput, match="app_id"):
        operator.onboard_app(OPERATORS, read=["diet"], purpose="personalization")
    assert len(operator.policy_history()) == version
    assert keys.create("app:operators").info.app_id == "app:operators"  # only the exact name


@pytest.mark.parametrize("name", sorted(RESERVED_APP_IDS - {OPERATORS}))
def test_no_app_takes_the_name_of_uprofs_own_principals(
    kernel: Uprof, keys: ApiKeyStore, name: str
) -> None:
    """``operator:local``, ``system:worker`` and ``privacy-center`` passed the app-id
    check: an app so named wrote audit entries that read as the local operator's, the
    pipeline's or the user's own. No key, no onboarding; a key issued under such a name
    before authenticates as nobody."""
    with pytest.raises(DomainInvalidInput, match="app_id"):
        keys.create(name)
    operator = Facade(kernel, FacadePrincipal.local_operator(kernel.subjects.tenant))
    version = len(operator.policy_history())
    with pytest.raises(DomainInvalidInput, match="app_id"):
        operator.onboard_app(name, read=["diet"], purpose="personalization")
    assert len(operator.policy_history()) == version
    issued, control = keys.create("app:renamed-later"), keys.create("app:control")
    with keys._engine.begin() as conn:  # as if issued before the name was refused
        conn.execute(
            api_keys.update().where(api_keys.c.key_id == issued.info.key_id).values(app_id=name)
        )
    assert keys.authenticate(control.token) is not None
    assert keys.authenticate(issued.token) is None


def test_an_app_named_operators_is_not_an_operator(kernel: Uprof) -> None:
    """A key issued for ``operators`` before the key store refused it (or embedded code
    naming it) erased any subject, through the SDK, MCP or REST: the door decided it as
    the policy's ``operators``. Now refused and audited, nothing erased."""
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    client = Client.embedded(kernel, OPERATORS)
    runtime = ServiceRuntime.for_kernel(kernel)
    runtime.start()
    server = build_server(runtime, stdio_principal=Principal(OPERATORS, "k", frozenset({"app"})))

    async def forget_item() -> Any:
        async with McpClient(server) as mcp:
            return await mcp.call_tool("forget", {"subject": "alice", "item_id": "x"})

    codes = []
    try:
        for attempt in (
            lambda: client.erase_subject("alice"),
            lambda: client.export_subject("alice"),
            lambda: client.erase_item("alice", "x"),
        ):
            with pytest.raises(APIError) as refused:
                attempt()
            codes.append(refused.value.code)
        codes.append(_error(asyncio.run(forget_item()))["code"])
    finally:
        client.close()
        runtime.stop()
    assert codes == ["permission_denied"] * 4
    assert [c.app_id for c in kernel.profile("alice").consents] == [PLANNER]  # not erased


def test_embedded_code_naming_a_role_is_not_that_role(kernel: Uprof) -> None:
    """Held on 2026-12-04 (the authorizer refuses a malformed app id): embedded code is
    trusted to name its app, not a role, and ``Client.embedded(kernel, "role:dpo")``
    gets none of the DPO role's rows. A regression test, not a fix."""
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    client = Client.embedded(kernel, "role:dpo")
    try:
        with pytest.raises(APIError) as refused:
            client.erase_subject("alice")
    finally:
        client.close()
    assert refused.value.code == "permission_denied"
    assert [c.app_id for c in kernel.profile("alice").consents] == [PLANNER]
