"""What one tenant's callers learn of another tenant on the same stores, beyond entries.

Found on 2026-12-05 (decision 0089 left the residue scan deployment-wide):

* the residue scan (the compliance console's, any operator key of any tenant) scans every
  file and table of the stores and checks every erased stream: tenant B's operator saw
  how many subjects tenant A erased (``streams_checked``), how many events they held,
  and where a term of A's data is found. Where the log shows another tenant, the scan is
  now the local operator's alone (the CLI, who holds every file anyway); an operator key
  is refused (audited ``access.denied``, ``reason_code`` ``stores-shared``);
* ``GET /v1/audit/key`` handed every key, of any app, a fresh signed checkpoint, whose
  tree size counts every tenant's entries: an app reading it twice learned how much the
  whole deployment wrote meanwhile. The public key and origin stay for anyone; the
  checkpoint is for callers the policy lets ``audit``.

Both backends.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from domain.errors import PermissionDeniedError
from domain.principal import Principal, PrincipalKind
from tests.api.conftest import PLANNER, Apps, bearer, grant, interaction, tenant_servers
from tests.api.test_audit_tenants import _erase_in_a
from tests.conftest import OTHER_TENANT, Backend
from tests.web.conftest import csrf_of
from uprof.api import ApiKeyStore
from uprof.facade import Facade
from uprof.kernel import Uprof


def _refusals(kernel: Uprof) -> list[dict[str, object]]:
    return [
        e.entry
        for e in kernel.audit_entries(action="access.denied")
        if e.entry.get("reason_code") == "stores-shared"
    ]


def test_another_tenants_operator_key_cannot_residue_scan_shared_stores(
    kernel: Uprof, keys: ApiKeyStore, other: tuple[Uprof, ApiKeyStore], backend: Backend
) -> None:
    other_kernel, other_keys = other
    a_planner = keys.create(PLANNER).token
    a_operator = keys.create(PLANNER, ["app", "operator"]).token
    b_operator = other_keys.create(PLANNER, ["app", "operator"]).token
    with tenant_servers(kernel, keys, other) as (_, b_live, a, _):
        _erase_in_a(a, a_planner, a_operator)  # tenant A erases alice
        with httpx.Client(base_url=b_live.url, timeout=60) as console:
            console.post("/console/login", data={"api_key": b_operator})
            csrf = csrf_of(console.get("/console/receipts").text)
            scanned = console.post("/console/residue", data={"csrf": csrf, "terms": "tea"})
    # B's operator learns nothing of A's stores: refused, as a page, and audited.
    assert scanned.status_code == 403, scanned.text
    assert "erased streams" not in scanned.text
    (refused,) = _refusals(other_kernel)
    assert refused["tenant"] == OTHER_TENANT and str(refused["principal"]).startswith(PLANNER)
    # The same at the door, for any operator key of a tenant whose stores are shared.
    key_principal = Principal(
        OTHER_TENANT, PLANNER, "k1", PrincipalKind.OPERATOR, frozenset({"app"})
    )
    with pytest.raises(PermissionDeniedError):
        Facade(other_kernel, key_principal).residue_scan(["Zq7-never-said"])
    assert len(_refusals(other_kernel)) == 2
    # The local operator (the CLI: whoever holds the data folder holds every file) scans.
    local = Facade(other_kernel, Principal.local_operator(OTHER_TENANT))
    report = local.residue_scan(["Zq7-never-said"])
    assert report.streams_checked == 1


def test_a_tenant_alone_on_its_stores_keeps_the_consoles_residue_scan(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    key_principal = Principal("default", PLANNER, "k1", PrincipalKind.OPERATOR, frozenset({"app"}))
    report = Facade(kernel, key_principal).residue_scan(["Zq7-never-said"])
    assert report.clean
    assert _refusals(kernel) == []


def test_only_the_audit_right_sees_the_logs_size(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    grant(http, apps.planner)
    ack = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I like tea")},
    )
    assert ack.status_code == 201, ack.text
    app_view = http.get("/v1/audit/key", headers=bearer(apps.planner))
    operator_view = http.get("/v1/audit/key", headers=bearer(apps.planner_operator))
    assert app_view.status_code == operator_view.status_code == 200
    # Anyone keeps the key and origin to verify with; the size is for the audit right.
    app_key, operator_key = app_view.json(), operator_view.json()
    assert app_key["public_key_pem"] == operator_key["public_key_pem"]
    assert app_key["origin"] == operator_key["origin"]
    assert app_key.get("checkpoint") is None, app_key
    size = int(operator_key["checkpoint"].split("\n")[1])
    assert size >= 1
    # Refused nothing: an app asking for the key writes no denial.
    assert not [e for e in kernel.audit_entries(action="access.denied") if e.entry.get("principal")]


def test_the_clis_checkpoint_needs_the_audit_right(backend: Backend, tmp_path: Path) -> None:
    """``uprof audit checkpoint`` is decided as an export; the public key stays for anyone."""
    from tests.api.test_audit_proofs import cli_for

    run = cli_for(backend)
    note, pem = tmp_path / "now.note", tmp_path / "audit.pem"
    assert "tree size" in run("audit", "checkpoint", "--out", str(note))
    run(
        "policy",
        "revoke",
        "--role",
        "role:operator",
        "--action",
        "audit",
        "--category",
        "any",
        "--purpose",
        "compliance",
    )
    run("audit", "checkpoint", "--out", str(tmp_path / "refused.note"), code=3)
    assert not (tmp_path / "refused.note").exists()
    run("audit", "public-key", "--out", str(pem))
    assert pem.read_text().startswith("-----BEGIN PUBLIC KEY-----")
