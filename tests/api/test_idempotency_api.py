"""Idempotency-Key on every write surface (I14): REST, SDK (HTTP, async, embedded), MCP."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from mcp import Client as McpClient

from tests.api.conftest import (
    CALENDAR,
    MCP_CAPTURE,
    PLANNER,
    Apps,
    LiveServer,
    bearer,
    grant,
    interaction,
    planner_mcp_server,
)
from uprof.eventstore import CAPTURED_TOPIC
from uprof.kernel import Uprof
from uprof.sdk import AsyncClient, AttributeProposalIn, Client, ConflictError, InvalidRequestError

WHEN = datetime(2025, 1, 1, 9, tzinfo=UTC)
WRITE_ROUTES = [
    "/v1/captures",
    "/v1/captures/batch",
    "/v1/consents",
    "/v1/consents/withdraw",
    "/v1/proposals",
]


def captures_in_log(kernel: Uprof) -> int:
    return len(kernel.app.notifications_after(0, 100_000, [CAPTURED_TOPIC]))


def post(
    http: httpx.Client, key: str, path: str, body: dict[str, Any], idem: str | None
) -> httpx.Response:
    headers = bearer(key) | ({"Idempotency-Key": idem} if idem else {})
    return http.post(path, headers=headers, json=body)


def test_capture_replay_returns_the_same_ack_and_captures_once(
    http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    grant(http, apps.planner)
    body = {"subject": "alice", **interaction("I like green tea", ref="D1:1")}
    first = post(http, apps.planner, "/v1/captures", body, "k-1")
    again = post(http, apps.planner, "/v1/captures", body, "k-1")
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert captures_in_log(kernel) == 1
    # Without a key, the same body is a new capture (the key is what makes it a retry).
    assert post(http, apps.planner, "/v1/captures", body, None).json() != first.json()
    assert captures_in_log(kernel) == 2


def test_same_key_different_body_is_409_naming_the_header(
    http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    grant(http, apps.planner)
    post(http, apps.planner, "/v1/captures", {"subject": "alice", **interaction("a")}, "k-1")
    other = post(
        http, apps.planner, "/v1/captures", {"subject": "alice", **interaction("b")}, "k-1"
    )
    assert other.status_code == 409
    error = other.json()["error"]
    assert error["code"] == "idempotency_key_reused" and "Idempotency-Key" in error["message"]
    assert captures_in_log(kernel) == 1


def test_another_apps_key_never_replays_its_answer(
    http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    grant(http, apps.planner)
    grant(http, apps.calendar, purposes=("scheduling",))
    body = {"subject": "alice", **interaction("I like green tea", purpose="scheduling")}
    mine = post(
        http,
        apps.planner,
        "/v1/captures",
        {"subject": "alice", **interaction("I like green tea")},
        "shared-key",
    )
    theirs = post(http, apps.calendar, "/v1/captures", body, "shared-key")
    assert theirs.status_code == 201 and "Idempotent-Replayed" not in theirs.headers
    assert theirs.json()["capture_id"] != mine.json()["capture_id"]
    assert captures_in_log(kernel) == 2


def test_batch_consent_and_proposal_writes_replay(
    http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    consent = {
        "subject": "alice",
        "categories": ["*"],
        "purposes": ["personalization"],
        "collected_by": "consent-ui:test",
    }
    g1 = post(http, apps.planner, "/v1/consents", consent, "g-1")
    g2 = post(http, apps.planner, "/v1/consents", consent, "g-1")
    assert g1.status_code == g2.status_code == 201 and g1.json() == g2.json()
    listed = http.post(
        "/v1/consents/list", headers=bearer(apps.planner), json={"subject": "alice"}
    ).json()["consents"]
    assert len(listed) == 1

    batch = {
        "subject": "alice",
        "interactions": [interaction("I like tea"), interaction("I live in Lyon")],
    }
    b1 = post(http, apps.planner, "/v1/captures/batch", batch, "b-1")
    b2 = post(http, apps.planner, "/v1/captures/batch", batch, "b-1")
    assert b1.status_code == b2.status_code == 201 and b1.json() == b2.json()
    assert captures_in_log(kernel) == 2

    evidence = b1.json()["acks"][0]["capture_id"]
    proposals = {
        "subject": "alice",
        "agent_id": "agent:one",
        "sharing": "shared",
        "proposals": [
            {"kind": "attribute", "key": "likes", "value": "tea", "evidence": [evidence]}
        ],
    }
    p1 = post(http, apps.planner, "/v1/proposals", proposals, "p-1")
    p2 = post(http, apps.planner, "/v1/proposals", proposals, "p-1")
    assert p1.status_code == p2.status_code == 200, p1.text
    assert p1.json() == p2.json() and p2.headers["Idempotent-Replayed"] == "true"

    withdraw = {"subject": "alice", "consent_id": g1.json()["consent_id"]}
    w1 = post(http, apps.planner, "/v1/consents/withdraw", withdraw, "w-1")
    w2 = post(http, apps.planner, "/v1/consents/withdraw", withdraw, "w-1")
    assert w1.status_code == w2.status_code == 200, w1.text
    assert w1.json() == w2.json() and w2.headers["Idempotent-Replayed"] == "true"


def test_a_refused_keyed_capture_can_be_retried_after_consent(
    http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    grant(http, apps.calendar, purposes=("scheduling",))  # alice exists; planner has no consent
    body = {"subject": "alice", **interaction("I like green tea")}
    assert post(http, apps.planner, "/v1/captures", body, "k-1").status_code == 403
    grant(http, apps.planner)
    retry = post(http, apps.planner, "/v1/captures", body, "k-1")
    assert retry.status_code == 201 and "Idempotent-Replayed" not in retry.headers
    assert captures_in_log(kernel) == 1


@pytest.mark.parametrize("key", ["has space", "x" * 256])
def test_a_malformed_key_is_422_naming_the_header(
    http: httpx.Client, kernel: Uprof, apps: Apps, key: str
) -> None:
    grant(http, apps.planner)
    bad = post(http, apps.planner, "/v1/captures", {"subject": "alice", **interaction("a")}, key)
    assert bad.status_code == 422
    assert "Idempotency-Key" in bad.text
    assert captures_in_log(kernel) == 0


def test_openapi_documents_the_header_on_every_write(http: httpx.Client) -> None:
    spec = http.get("/openapi.json").json()
    for path in WRITE_ROUTES:
        params = spec["paths"][path]["post"]["parameters"]
        header = next(p for p in params if p["name"] == "Idempotency-Key")
        assert header["in"] == "header" and not header.get("required", False)
        assert "idempotency_key_reused" in header["description"]
        assert "409" in spec["paths"][path]["post"]["responses"]


# ----------------------------------------------------------------------- SDK


def sdk_script(client: Client) -> tuple[Any, ...]:
    consent_id = client.grant_consent(
        "alice",
        categories=["*"],
        purposes=["personalization"],
        collected_by="consent-ui:test",
        idempotency_key="g",
    )
    again = client.grant_consent(
        "alice",
        categories=["*"],
        purposes=["personalization"],
        collected_by="consent-ui:test",
        idempotency_key="g",
    )
    ack = client.capture(
        "alice",
        agent_id="agent:one",
        user_input="I like tea",
        occurred_at=WHEN,
        idempotency_key="c",
    )
    ack2 = client.capture(
        "alice",
        agent_id="agent:one",
        user_input="I like tea",
        occurred_at=WHEN,
        idempotency_key="c",
    )
    acks = client.capture_many(
        "alice",
        [{"agent_id": "agent:one", "user_input": "x", "occurred_at": WHEN}],
        idempotency_key="b",
    )
    acks2 = client.capture_many(
        "alice",
        [{"agent_id": "agent:one", "user_input": "x", "occurred_at": WHEN}],
        idempotency_key="b",
    )
    proposal = [AttributeProposalIn(key="likes", value="tea", evidence=[ack.capture_id])]
    applied = client.submit_proposals("alice", proposal, agent_id="agent:one", idempotency_key="p")
    applied2 = client.submit_proposals("alice", proposal, agent_id="agent:one", idempotency_key="p")
    with pytest.raises(ConflictError) as reused:
        client.capture(
            "alice", agent_id="agent:one", user_input="other", occurred_at=WHEN, idempotency_key="c"
        )
    with pytest.raises(InvalidRequestError) as no_time:
        client.capture("alice", agent_id="agent:one", user_input="I like tea", idempotency_key="c")
    w1 = client.withdraw_consent("alice", consent_id, idempotency_key="w")
    w2 = client.withdraw_consent("alice", consent_id, idempotency_key="w")
    return (
        consent_id == again,
        ack == ack2,
        acks == acks2,
        applied == applied2 == 1,
        reused.value.code,
        "occurred_at" in str(no_time.value),
        w1 == w2,
    )


EXPECTED = (True, True, True, True, "idempotency_key_reused", True, True)


def test_sdk_http_client_sends_the_key(server: LiveServer, apps: Apps, kernel: Uprof) -> None:
    with Client(server.url, apps.planner) as client:
        assert sdk_script(client) == EXPECTED
    assert captures_in_log(kernel) == 2


def test_sdk_embedded_client_passes_the_key(kernel: Uprof) -> None:
    with Client.embedded(kernel, PLANNER) as client:
        assert sdk_script(client) == EXPECTED
    assert captures_in_log(kernel) == 2


def test_sdk_async_client_sends_the_key(server: LiveServer, apps: Apps, kernel: Uprof) -> None:
    async def scenario() -> tuple[Any, Any]:
        async with AsyncClient(server.url, apps.planner) as client:
            await client.grant_consent(
                "alice",
                categories=["*"],
                purposes=["personalization"],
                collected_by="consent-ui:test",
            )
            a = await client.capture(
                "alice",
                agent_id="agent:one",
                user_input="I like tea",
                occurred_at=WHEN,
                idempotency_key="c",
            )
            b = await client.capture(
                "alice",
                agent_id="agent:one",
                user_input="I like tea",
                occurred_at=WHEN,
                idempotency_key="c",
            )
            return a, b

    a, b = asyncio.run(scenario())
    assert a == b and captures_in_log(kernel) == 1


# ----------------------------------------------------------------------- MCP


def test_mcp_capture_takes_an_idempotency_key(kernel: Uprof) -> None:
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    kernel.grant_consent("alice", app_id=CALENDAR, categories=["*"], purposes=["personalization"])
    args = MCP_CAPTURE

    async def scenario(server: Any) -> list[Any]:
        async with McpClient(server) as client:
            return [
                await client.call_tool("capture", args),
                await client.call_tool("capture", args),
                await client.call_tool("capture", {**args, "user_input": "other"}),
                await client.call_tool(
                    "capture", {k: v for k, v in args.items() if k != "occurred_at"}
                ),
            ]

    with planner_mcp_server(kernel) as server:
        first, again, reused, untimed = asyncio.run(scenario(server))
    assert not first.is_error and first.structured_content == again.structured_content
    assert reused.is_error and "idempotency_key_reused" in str(reused.content)
    assert untimed.is_error and "occurred_at" in str(untimed.content)
    assert captures_in_log(kernel) == 1


def test_a_withdrawal_whose_first_still_runs_is_409_request_in_progress(
    http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    """Bug JG at the edge: the key's turn held (as the first request, still erasing, holds
    it), the resend is refused 409 ``request_in_progress`` with Retry-After, naming the
    header, and nothing is withdrawn; once the turn is free the same request runs."""
    from uprof.backends import backend_for

    consent_id = grant(http, apps.planner)
    store = kernel.idempotency
    assert store is not None
    store.in_progress_wait_s = 0.2
    token = store.token(PLANNER, "w-held")
    engine = kernel.views_engine
    name = store.turn_name(token)
    body = {"subject": "alice", "consent_id": consent_id, "erase": True}
    with backend_for(engine).named_lock(engine, name, wait_s=0) as held:
        assert held
        refused = post(http, apps.planner, "/v1/consents/withdraw", body, "w-held")
    assert refused.status_code == 409, refused.text
    assert refused.headers["Retry-After"] == "5"
    error = refused.json()["error"]
    assert error["code"] == "request_in_progress", error
    assert [f["field"] for f in error["fields"]] == ["Idempotency-Key"]
    assert all(c.withdrawn_at is None for c in kernel.profile("alice").consents)
    done = post(http, apps.planner, "/v1/consents/withdraw", body, "w-held")
    assert done.status_code == 200, done.text
    assert done.json()["consent"]["withdrawn_at"] is not None
