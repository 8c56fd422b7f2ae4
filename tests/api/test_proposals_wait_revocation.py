"""Proposals that wait for the subject's captures view are written only if their key
still stands after the wait (SQLite and PostgreSQL).

``POST /v1/proposals`` (and MCP ``remember``'s proposals, the SDK's ``submit_proposals``)
waits up to ``read_wait_timeout_s`` for the subject's views before it checks the evidence
(``Uprof.submit_proposals``: an agent cites what it just captured). The key, the policy's
``propose`` and the consent were asked before that wait only. Found in the review of
0108/0109: a key revoked during the wait (``uprof apps revoke``, another process) still
had its proposals written into the subject's profile. They are now decided again after
the wait (``Facade._decided_again``), as the reads that wait are.
"""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import PLANNER, bearer, grant, interaction
from tests.api.test_consent_withdraw_wait_revocation import during_wait_number
from tests.api.test_slice_wait_revocation import revoke_elsewhere
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.settings import Settings

MEMORY = "enjoys sailing on weekends"


def _propose(http: httpx.Client, token: str, capture_id: str) -> httpx.Response:
    return http.post(
        "/v1/proposals",
        headers=bearer(token),
        json={
            "subject": "alice",
            "agent_id": "agent:one",
            "purpose": "personalization",
            "proposals": [
                {
                    "kind": "memory",
                    "text": MEMORY,
                    "category": "preference",
                    "evidence": [capture_id],
                },
            ],
        },
    )


def _captured(http: httpx.Client, kernel: Uprof, token: str) -> str:
    grant(http, token)
    captured = http.post(
        "/v1/captures",
        headers=bearer(token),
        json={"subject": "alice", **interaction("I like sailing")},
    )
    assert captured.status_code == 201, captured.text
    assert kernel.wait_until_caught_up(30)
    return str(captured.json()["capture_id"])


def _remembered(kernel: Uprof) -> bool:
    assert kernel.wait_until_caught_up(30)
    return any(m.text == MEMORY for m in kernel.profile("alice").memories)


def test_a_key_revoked_during_the_wait_writes_no_proposal(
    http: httpx.Client,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER)
    capture_id = _captured(http, kernel, issued.token)
    waits = during_wait_number(
        kernel, monkeypatch, 1, revoke_elsewhere(settings, keys, issued.info.key_id, clock)
    )

    proposed = _propose(http, issued.token, capture_id)

    assert waits, "the proposals waited for the views"
    assert proposed.status_code == 401, proposed.text
    assert proposed.json()["error"]["code"] == "unauthenticated"
    assert not _remembered(kernel)


def test_a_live_key_writes_its_proposal_after_the_wait(
    http: httpx.Client, kernel: Uprof, keys: ApiKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard: the same proposal with a key that stands is written."""
    issued = keys.create(PLANNER)
    capture_id = _captured(http, kernel, issued.token)
    waits = during_wait_number(kernel, monkeypatch, 1, lambda: None)

    proposed = _propose(http, issued.token, capture_id)

    assert waits
    assert proposed.status_code in (200, 201), proposed.text
    assert _remembered(kernel)
