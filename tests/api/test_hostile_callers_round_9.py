"""Hostile callers, round 9 (decision XXXX-hostile-callers-round-9): the doors that changed
since round 8, attacked against a live server on SQLite and PostgreSQL."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.api.conftest import PLANNER, Apps, bearer, grant
from tests.web.conftest import deny_operators
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.settings import Settings

ROTATION_PROOF = "/v1/audit/rotation-proof"


def _proofs_served(kernel: Uprof) -> int:
    kernel.reads.drain()
    return sum(1 for e in kernel.audit_log.entries() if e.entry["action"] == "audit.proof_served")


@pytest.mark.parametrize("field", ["checkpoint", "receipt"])
@pytest.mark.parametrize("junk", ["\ud800 note", "a\x00note"], ids=["surrogate", "nul"])
def test_a_rotation_proof_of_malformed_text_is_422_naming_the_field(
    http: httpx.Client, apps: Apps, kernel: Uprof, field: str, junk: str
) -> None:
    before = _proofs_served(kernel)
    answer = http.post(
        ROTATION_PROOF,
        headers={**bearer(apps.planner_operator), "Content-Type": "application/json"},
        # json.dumps writes a lone surrogate and a NUL as escapes, as a hostile client may
        content=json.dumps({field: junk}).encode(),
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["fields"][0]["field"] == field, answer.text
    assert _proofs_served(kernel) == before


def test_a_rotation_proof_is_refused_without_the_rights(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    note = http.get("/v1/audit/key", headers=bearer(apps.planner_operator)).json()["checkpoint"]
    for headers in ({}, bearer("up_not_a_key"), bearer(apps.planner)):
        refused = http.post(ROTATION_PROOF, headers=headers, json={"checkpoint": note})
        assert refused.status_code in (401, 403), refused.text
    deny_operators(kernel, "audit", "compliance")
    refused = http.post(
        ROTATION_PROOF, headers=bearer(apps.planner_operator), json={"checkpoint": note}
    )
    assert refused.status_code == 403, refused.text


def test_a_key_revoked_during_the_withdrawals_own_wait_erases_nothing(
    http: httpx.Client,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug QV, the key's half: an app withdrawing its own consent with ``erase`` (no
    policy asked: it erases what it collected) was decided again after the consent
    listing's wait (0109), but the kernel's withdrawal waits once more (its profile read
    of the consent) and then withdrew and erased, with a receipt, for a key another
    process revoked during that second wait. Decided again before the first write: 401,
    nothing withdrawn or erased."""
    from tests.api.test_consent_withdraw_wait_revocation import (
        _collected,
        _governed,
        during_wait_number,
    )
    from tests.api.test_slice_wait_revocation import revoke_elsewhere

    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER)
    consent_id = grant(http, issued.token)
    _collected(http, kernel, issued.token)
    before = _governed(kernel)
    # Wait 1 is REST's check of the app's consents, 2 the door's listing (each decided
    # again after it), 3 the kernel's own, which decided nothing after it.
    waits = during_wait_number(
        kernel, monkeypatch, 3, revoke_elsewhere(settings, keys, issued.info.key_id, clock)
    )

    withdrawn = http.post(
        "/v1/consents/withdraw",
        headers=bearer(issued.token),
        json={"subject": "alice", "consent_id": consent_id, "erase": True},
    )

    assert len(waits) >= 3, waits
    assert withdrawn.status_code == 401, withdrawn.text
    assert _governed(kernel) == before  # nothing withdrawn, nothing erased
    assert [c.consent_id for c in kernel.consents_in_force("alice")] == [consent_id]
