"""A keyed retry is decided like a fresh call: a revocation in between refuses it.

An idempotent replay used to return the stored first answer without asking anyone:
after the app's policy role was removed, the subject's consent withdrawn or the
subject erased, a retry with the same Idempotency-Key still answered 201/200 with
the first answer (marked replayed), while the same request without the key, or with
a new key, was refused. A replay is now authorized exactly like a fresh call (the
write path runs again, and the subject's stream makes it write nothing), and a
successful replay is audited (``request.replayed``).
"""

from __future__ import annotations

import asyncio
import functools
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from mcp import Client as McpClient

from tests.api.conftest import (
    MCP_CAPTURE,
    PLANNER,
    Apps,
    bearer,
    grant,
    interaction,
    planner_mcp_server,
)
from uprof.api import ApiKeyStore
from uprof.eventstore import CAPTURED_TOPIC
from uprof.kernel import Uprof
from uprof.sdk import Client, PermissionDeniedError
from uprof.services.idempotency import idempotency_keys

OPERATOR = "operator:test"
WHEN = datetime(2025, 1, 1, 9, tzinfo=UTC)


def post(
    http: httpx.Client, key: str, path: str, body: dict[str, Any], idem: str
) -> httpx.Response:
    return http.post(path, headers=bearer(key) | {"Idempotency-Key": idem}, json=body)


def captures_in_log(kernel: Uprof) -> int:
    return len(kernel.app.notifications_after(0, 100_000, [CAPTURED_TOPIC]))


def entries(kernel: Uprof) -> list[dict[str, Any]]:
    kernel.reads.drain()
    return [e.entry for e in kernel.audit_log.entries()]


def actions(kernel: Uprof) -> list[str]:
    return [e["action"] for e in entries(kernel)]


def capture_body(text: str = "I like green tea") -> dict[str, Any]:
    return {"subject": "alice", **interaction(text)}


def test_a_capture_replay_after_the_apps_role_is_removed_is_refused(
    http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    grant(http, apps.planner)
    first = post(http, apps.planner, "/v1/captures", capture_body(), "k-1")
    assert first.status_code == 201
    kernel.policy_revoke(requested_by=OPERATOR, app_id=PLANNER, role="role:assistant")
    fresh = post(http, apps.planner, "/v1/captures", capture_body(), "k-new")
    assert fresh.status_code == 403
    again = post(http, apps.planner, "/v1/captures", capture_body(), "k-1")
    assert again.status_code == 403, again.text
    assert again.json()["error"]["code"] == fresh.json()["error"]["code"]
    assert "Idempotent-Replayed" not in again.headers
    assert actions(kernel).count("access.denied") == 2  # the replay's refusal is audited
    assert captures_in_log(kernel) == 1


def test_a_capture_replay_after_consent_is_withdrawn_is_refused(
    http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    consent_id = grant(http, apps.planner)
    assert post(http, apps.planner, "/v1/captures", capture_body(), "k-1").status_code == 201
    withdrawn = http.post(
        "/v1/consents/withdraw",
        headers=bearer(apps.planner),
        json={"subject": "alice", "consent_id": consent_id},
    )
    assert withdrawn.status_code == 200, withdrawn.text
    fresh = post(http, apps.planner, "/v1/captures", capture_body(), "k-new")
    again = post(http, apps.planner, "/v1/captures", capture_body(), "k-1")
    assert fresh.status_code == again.status_code == 403, again.text
    assert again.json()["error"]["code"] == fresh.json()["error"]["code"]
    assert captures_in_log(kernel) == 1
    assert actions(kernel).count("capture.refused") == 2  # the replay's refusal is audited


def test_replays_after_the_subject_is_erased_answer_as_a_fresh_call(
    http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    consent = {
        "subject": "alice",
        "categories": ["*"],
        "purposes": ["personalization"],
        "collected_by": "consent-ui:test",
    }
    granted = post(http, apps.planner, "/v1/consents", consent, "g-1")
    assert granted.status_code == 201
    captured = post(http, apps.planner, "/v1/captures", capture_body(), "k-1")
    assert captured.status_code == 201
    batch = {"subject": "alice", "interactions": [interaction("I live in Lyon")]}
    assert post(http, apps.planner, "/v1/captures/batch", batch, "b-1").status_code == 201
    kernel.erase_subject("alice")
    for path, body, key in (
        ("/v1/captures", capture_body(), "k-1"),
        ("/v1/captures/batch", batch, "b-1"),
        ("/v1/consents", consent, "g-1"),
    ):
        fresh = post(http, apps.planner, path, body, f"{key}-new")
        again = post(http, apps.planner, path, body, key)
        assert again.status_code == fresh.status_code == 410, (path, again.text)
        assert "Idempotent-Replayed" not in again.headers
    assert captures_in_log(kernel) == 2


def test_a_grant_replay_after_the_apps_role_is_removed_is_refused(
    http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    consent = {
        "subject": "alice",
        "categories": ["*"],
        "purposes": ["personalization"],
        "collected_by": "consent-ui:test",
    }
    assert post(http, apps.planner, "/v1/consents", consent, "g-1").status_code == 201
    kernel.policy_revoke(requested_by=OPERATOR, app_id=PLANNER, role="role:assistant")
    again = post(http, apps.planner, "/v1/consents", consent, "g-1")
    assert again.status_code == 403, again.text


def test_a_proposal_replay_after_consent_is_withdrawn_is_refused(
    http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    consent_id = grant(http, apps.planner)
    evidence = post(http, apps.planner, "/v1/captures", capture_body(), "k-1").json()["capture_id"]
    proposals = {
        "subject": "alice",
        "agent_id": "agent:one",
        "sharing": "shared",
        "proposals": [
            {"kind": "attribute", "key": "likes", "value": "tea", "evidence": [evidence]}
        ],
    }
    assert post(http, apps.planner, "/v1/proposals", proposals, "p-1").status_code == 200
    http.post(
        "/v1/consents/withdraw",
        headers=bearer(apps.planner),
        json={"subject": "alice", "consent_id": consent_id},
    ).raise_for_status()
    fresh = post(http, apps.planner, "/v1/proposals", proposals, "p-new")
    again = post(http, apps.planner, "/v1/proposals", proposals, "p-1")
    assert again.status_code == fresh.status_code, again.text
    assert again.status_code in (403, 404)


def test_a_replay_with_a_revoked_key_is_unauthenticated(
    http: httpx.Client, kernel: Uprof, keys: ApiKeyStore
) -> None:
    issued = keys.create(PLANNER)
    grant(http, issued.token)
    assert post(http, issued.token, "/v1/captures", capture_body(), "k-1").status_code == 201
    keys.revoke(issued.info.key_id)
    assert post(http, issued.token, "/v1/captures", capture_body(), "k-1").status_code == 401


def test_a_successful_replay_is_audited(http: httpx.Client, kernel: Uprof, apps: Apps) -> None:
    grant(http, apps.planner)
    assert post(http, apps.planner, "/v1/captures", capture_body(), "k-1").status_code == 201
    again = post(http, apps.planner, "/v1/captures", capture_body(), "k-1")
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    replayed = [e for e in entries(kernel) if e["action"] == "request.replayed"]
    assert len(replayed) == 1
    assert replayed[0]["app_id"] == PLANNER and replayed[0]["reason_code"] == "capture"


def test_a_replayed_erasing_withdrawal_returns_its_receipt_and_erases_nothing_again(
    http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    # Guard: the replay runs the write path again, which must find nothing left to erase.
    consent_id = grant(http, apps.planner)
    assert post(http, apps.planner, "/v1/captures", capture_body(), "k-1").status_code == 201
    body = {"subject": "alice", "consent_id": consent_id, "erase": True}
    first = post(http, apps.planner, "/v1/consents/withdraw", body, "w-1")
    assert first.status_code == 200, first.text
    assert first.json()["erasure"] is not None
    written = actions(kernel)
    again = post(http, apps.planner, "/v1/consents/withdraw", body, "w-1")
    assert again.status_code == 200, again.text
    expected = first.json()
    expected["erasure"]["subject_nonce_hex"] = ""  # the subject's alone, never kept (below)
    assert again.json() == expected
    assert again.headers["Idempotent-Replayed"] == "true"
    assert actions(kernel) == [*written, "request.replayed"]


def test_the_subjects_nonce_of_an_erasing_withdrawal_is_never_kept_for_replays(
    http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    # The nonce is the subject's alone (docs/audit-format.md §7): kept beside the receipt's
    # commitment, it would let anyone reading the store test guessed references against it.
    consent_id = grant(http, apps.planner)
    assert post(http, apps.planner, "/v1/captures", capture_body(), "k-1").status_code == 201
    body = {"subject": "alice", "consent_id": consent_id, "erase": True}
    first = post(http, apps.planner, "/v1/consents/withdraw", body, "w-1")
    nonce = first.json()["erasure"]["subject_nonce_hex"]
    assert len(nonce) >= 32  # the first answer carries it
    store = kernel.idempotency
    assert store is not None
    with store._engine.connect() as conn:
        kept = [r.response for r in conn.execute(sa.select(idempotency_keys)) if r.response]
    assert kept and not any(nonce in text for text in kept)
    again = post(http, apps.planner, "/v1/consents/withdraw", body, "w-1").json()
    assert again["erasure"]["subject_nonce_hex"] == ""
    assert again["erasure"]["receipt"] == first.json()["erasure"]["receipt"]


def test_mcp_and_embedded_sdk_replays_are_decided_again(kernel: Uprof) -> None:
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    args = MCP_CAPTURE

    async def twice(server: Any) -> list[Any]:
        async with McpClient(server) as client:
            first = await client.call_tool("capture", args)
            kernel.policy_revoke(requested_by=OPERATOR, app_id=PLANNER, role="role:assistant")
            return [first, await client.call_tool("capture", args)]

    with planner_mcp_server(kernel) as server, Client.embedded(kernel, PLANNER) as sdk:
        # One keyed SDK capture, sent before the revocation and again after it.
        keyed_capture = functools.partial(
            sdk.capture,
            "alice",
            agent_id="agent:one",
            user_input="I like coffee",
            occurred_at=WHEN,
            idempotency_key="s-1",
        )
        keyed_capture()
        first, again = asyncio.run(twice(server))
        with pytest.raises(PermissionDeniedError):
            keyed_capture()
    assert not first.is_error
    assert again.is_error and "permission_denied" in str(again.content)
    assert captures_in_log(kernel) == 2


def test_a_replay_after_the_subject_was_erased_and_recreated_writes_nothing(
    http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    # The name now stands for a new subject whose stream never saw the request: running
    # the write again there would capture (or consent) a second time, for someone else.
    consent = {
        "subject": "alice",
        "categories": ["*"],
        "purposes": ["personalization"],
        "collected_by": "consent-ui:test",
    }
    assert post(http, apps.planner, "/v1/consents", consent, "g-1").status_code == 201
    assert post(http, apps.planner, "/v1/captures", capture_body(), "k-1").status_code == 201
    kernel.erase_subject("alice")
    kernel.recreate_subject("alice")
    assert post(http, apps.planner, "/v1/consents", consent, "g-2").status_code == 201
    before = captures_in_log(kernel)
    for path, body, key in (
        ("/v1/captures", capture_body(), "k-1"),
        ("/v1/consents", consent, "g-1"),
    ):
        again = post(http, apps.planner, path, body, key)
        assert again.status_code == 410, (path, again.text)
    assert captures_in_log(kernel) == before
    listed = http.post(
        "/v1/consents/list", headers=bearer(apps.planner), json={"subject": "alice"}
    ).json()["consents"]
    assert len(listed) == 1  # g-2's only
