"""Hostile callers, round 9 (decision 0205-hostile-callers-round-9): the doors that changed
since round 8, attacked against a live server on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import PLANNER, Apps, bearer, grant
from tests.web.conftest import audit_denied_during_the_scan, deny_operators
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


def test_an_oversized_checkpoint_is_422_naming_it_and_serves_nothing(
    kernel: Uprof, keys: ApiKeyStore, apps: Apps
) -> None:
    """``checkpoint`` (0175) is capped at 64 KiB, below the default body limit (1 MiB;
    the ``server`` fixture's 64,000 bytes would answer 413 first): a note is a few
    hundred bytes, and the SDK and CLI send the note a file carries, not the file."""
    from tests.api.conftest import LiveServer
    from uprof.server import create_server

    before = _proofs_served(kernel)
    with (
        LiveServer(create_server(kernel, keys)) as live,
        httpx.Client(base_url=live.url, timeout=30) as client,
    ):
        answer = client.post(
            ROTATION_PROOF, headers=bearer(apps.planner_operator), json={"checkpoint": "n" * 65537}
        )
    assert answer.status_code == 422, answer.text[:300]
    assert answer.json()["error"]["fields"][0]["field"] == "checkpoint"
    assert _proofs_served(kernel) == before


@pytest.mark.parametrize(
    "extra",
    [{"issued_by": "k-other"}, {"tenant": "other-tenant"}, {"app_id": "app:calendar"}],
)
def test_a_sign_in_link_takes_no_identity_from_its_body(
    http: httpx.Client, apps: Apps, extra: dict[str, str]
) -> None:
    """``POST /v1/privacy/links``: the issuer (whose rights the link is worth, 0173) is
    the key; a body naming another issuer, tenant or app is 422 naming the field."""
    refused = http.post(
        "/v1/privacy/links",
        headers=bearer(apps.planner_operator),
        json={"subject": "alice", **extra},
    )
    assert refused.status_code == 422, refused.text[:300]
    assert next(iter(extra)) in refused.text


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


def test_a_residue_scan_another_tenant_joined_during_shows_nothing(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bug QW: an operator key's residue scan is refused on stores another tenant writes
    to (it reads every tenant's files, tables and erased streams), but the stores were
    looked at once, before the scan, which at scale reads for minutes (0187): a tenant's
    console scan, started while it was alone on the stores, showed its report though
    another tenant started on them (its first start writes its policy) during the scan,
    whose files and tables the scan then read. Looked at again when the scan ends: 403,
    audited ``stores-shared``, no report."""
    from tests.api.conftest import LiveServer, build_kernel
    from tests.conftest import OTHER_TENANT, seed_policy_for
    from tests.web.conftest import csrf_of
    from uprof.server import create_server

    b_settings = settings.model_copy(
        update={"tenant": OTHER_TENANT, "policy_path": seed_policy_for(OTHER_TENANT, tmp_path)}
    )
    b_kernel = build_kernel(b_settings)
    b_keys = ApiKeyStore.open(b_settings)
    try:
        b_operator = b_keys.create(PLANNER, ["app", "operator"]).token
        assert not b_kernel.stores_shared()
        scan = b_kernel.residue_scan

        def another_tenant_starts_during_the_scan(terms: Any) -> Any:
            build_kernel(settings).close()  # tenant "default", its first start
            return scan(terms)

        monkeypatch.setattr(b_kernel, "residue_scan", another_tenant_starts_during_the_scan)
        with (
            LiveServer(create_server(b_kernel, b_keys)) as b_live,
            httpx.Client(base_url=b_live.url, timeout=60) as console,
        ):
            assert console.post("/console/login", data={"api_key": b_operator})
            csrf = csrf_of(console.get("/console/receipts").text)
            scanned = console.post("/console/residue", data={"csrf": csrf, "terms": "tea"})
        assert b_kernel.stores_shared()
        assert scanned.status_code == 403, scanned.text[-400:]
        assert "erased streams" not in scanned.text
        b_kernel.reads.drain()
        refusals = [
            e.entry
            for e in b_kernel.audit_entries(action="access.denied")
            if e.entry.get("reason_code") == "stores-shared"
        ]
        assert len(refusals) == 1
    finally:
        b_keys.close()
        b_kernel.close()


def test_the_doors_residue_scan_is_decided_again_when_it_ends(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bug QW, the policy's half: the door decided ``audit`` before the scan only, and
    handed its report over though the operators were denied ``audit`` during it (the
    console hid it only because its page lists the receipts after the scan, decided
    again; the CLI printed it). Decided again when the scan ends: refused, audited."""
    from domain.errors import PermissionDeniedError
    from domain.principal import Principal, PrincipalKind
    from uprof.facade import Facade

    audit_denied_during_the_scan(kernel, monkeypatch)
    operator = Principal("default", PLANNER, "k1", PrincipalKind.OPERATOR, frozenset({"app"}))
    with pytest.raises(PermissionDeniedError):
        Facade(kernel, operator).residue_scan(["Zq7-never-said"])
    kernel.reads.drain()
    denied = [e.entry for e in kernel.audit_entries(action="access.denied")]
    assert denied and denied[-1]["reason_code"] == "audit"
