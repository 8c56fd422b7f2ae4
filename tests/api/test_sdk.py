"""The SDK against the live server, in embedded mode, and asynchronously: same answers."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from tests.api.conftest import PLANNER, Apps, LiveServer, api_settings, build_kernel
from tests.conftest import Backend
from uprof.kernel import Uprof
from uprof.sdk import (
    AsyncClient,
    AttributeProposalIn,
    AuthenticationError,
    Client,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
)

WHEN = datetime(2025, 1, 1, 9, tzinfo=UTC)


def exercise(client: Client) -> dict[str, object]:
    """One scripted session; returns what an app would observe."""
    seen: dict[str, object] = {}
    with pytest.raises(PermissionDeniedError) as refused:
        client.capture(
            "alice", agent_id="agent:one", user_input="I live in Paris", occurred_at=WHEN
        )
    seen["refused_code"] = refused.value.code
    consent_id = client.grant_consent(
        "alice", categories=["*"], purposes=["personalization"], collected_by="consent-ui:test"
    )
    ack = client.capture(
        "alice",
        agent_id="agent:one",
        user_input="I want to learn the cello",
        occurred_at=WHEN,
        sharing="shared",
        source_ref="D1:1",
    )
    acks = client.capture_many(
        "alice",
        [
            {"agent_id": "agent:one", "user_input": "I like jazz", "occurred_at": WHEN},
            {
                "agent_id": "agent:one",
                "user_input": "I live in Lisbon",
                "occurred_at": WHEN,
                "sharing": "shared",
            },
        ],
    )
    seen["batch"] = len(acks)
    seen["applied"] = client.submit_proposals(
        "alice",
        [AttributeProposalIn(key="likes", value="jazz", evidence=[acks[0].capture_id])],
        agent_id="agent:one",
        sharing="shared",
    )
    result = client.slice(
        "alice",
        "what instrument?",
        budget_tokens=256,
        purpose="personalization",
        agent_id="agent:one",
    )
    seen["slice_has_cello"] = "cello" in result.text
    seen["slice_evidence"] = ack.capture_id in {e for i in result.items for e in i.evidence}
    client.register_session("sess-1", "alice")
    by_session = client.slice(
        None,
        "jazz",
        session_id="sess-1",
        budget_tokens=128,
        purpose="personalization",
        agent_id="agent:one",
    )
    seen["session_pseudonym"] = by_session.subject_pseudonym == result.subject_pseudonym
    seen["consents"] = [c.consent_id for c in client.consents("alice")] == [consent_id]
    with pytest.raises(InvalidRequestError) as bad:
        client.slice("alice", "q", budget_tokens=-5, purpose="personalization", agent_id="a")
    seen["bad_field"] = bad.value.fields[0].field
    with pytest.raises(NotFoundError):
        client.slice("nobody", "q", budget_tokens=5, purpose="personalization", agent_id="a")
    with pytest.raises(PermissionDeniedError) as role:
        client.profile("alice")
    seen["role_code"] = role.value.code
    withdrawn = client.withdraw_consent("alice", consent_id)
    seen["withdrawn"] = withdrawn.consent.withdrawn_at is not None and withdrawn.erasure is None
    with pytest.raises(PermissionDeniedError) as denied:
        client.erase_subject("alice")
    seen["erase_code"] = denied.value.code
    seen["whoami"] = client.whoami().app_id
    return seen


EXPECTED = {
    "refused_code": "consent_required",
    "batch": 2,
    "applied": 1,
    "slice_has_cello": True,
    "slice_evidence": True,
    "session_pseudonym": True,
    "consents": True,
    "bad_field": "budget_tokens",
    "role_code": "role_required",
    "withdrawn": True,
    "erase_code": "permission_denied",
    "whoami": PLANNER,
}


def test_http_client_against_the_live_server(server: LiveServer, apps: Apps) -> None:
    with Client(server.url, apps.planner) as client:
        assert exercise(client) == EXPECTED


def test_embedded_client_behaves_like_the_http_client(kernel: Uprof) -> None:
    # The fixture kernel is configured for background workers: the client runs one.
    with Client.embedded(kernel, PLANNER) as client:
        assert exercise(client) == EXPECTED


def test_embedded_client_over_an_inline_kernel(backend: Backend) -> None:
    kernel = build_kernel(api_settings(backend, background=False))
    try:
        with Client.embedded(kernel, PLANNER) as client:
            assert exercise(client) == EXPECTED
    finally:
        kernel.close()


def test_operator_reads_profile_and_evidence(server: LiveServer, apps: Apps) -> None:
    with Client(server.url, apps.planner_operator) as client:
        client.grant_consent(
            "alice", categories=["*"], purposes=["personalization"], collected_by="consent-ui:test"
        )
        ack = client.capture(
            "alice", agent_id="agent:one", user_input="I live in Lisbon", occurred_at=WHEN
        )
        profile = client.profile("alice")
        item = next(a for a in profile.attributes if a.key == "home_location")
        assert item.value == "Lisbon"
        evidence = client.evidence("alice", item.item_id)
        assert [c.capture_id for c in evidence.captures] == [ack.capture_id]


def test_bad_key_raises_authentication_error(server: LiveServer) -> None:
    with Client(server.url, "upk_nope") as client, pytest.raises(AuthenticationError) as caught:
        client.whoami()
    assert caught.value.status == 401


def test_client_side_validation_names_the_field_before_sending(kernel: Uprof) -> None:
    with Client.embedded(kernel, PLANNER) as client, pytest.raises(InvalidRequestError) as caught:
        client.capture("alice", agent_id="", user_input="hi", occurred_at=WHEN)
    assert caught.value.fields[0].field == "agent_id"


def test_async_client_against_the_live_server(server: LiveServer, apps: Apps) -> None:
    async def scenario() -> tuple[str, bool]:
        async with AsyncClient(server.url, apps.planner) as client:
            await client.grant_consent(
                "bob",
                categories=["*"],
                purposes=["personalization"],
                collected_by="consent-ui:test",
            )
            acks = await asyncio.gather(
                *[
                    client.capture(
                        "bob",
                        agent_id="agent:one",
                        user_input=f"I want to visit place {i}",
                        occurred_at=WHEN,
                        sharing="shared",
                    )
                    for i in range(5)
                ]
            )
            result = await client.slice(
                "bob",
                "where do I want to go?",
                budget_tokens=512,
                purpose="personalization",
                agent_id="agent:one",
            )
            who = await client.whoami()
            return who.app_id, {a.capture_id for a in acks} <= {
                e for i in result.items for e in i.evidence
            }

    assert asyncio.run(scenario()) == (PLANNER, True)
