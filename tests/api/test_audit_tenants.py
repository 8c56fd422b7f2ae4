"""An ``audit`` right reads its own tenant's entries only.

Found in the hostile-caller review (2026-12-05, "Left"): tenants on one set of stores
(``UPROF_TENANT``) share one audit log, and no read path looked at the ``tenant`` every
entry names, so an auditor of tenant B read tenant A's entries through every audit read:
entry pages, receipts, exports (REST, the console's), and a proof's ``leaf_index`` entry.
Each read now keeps the caller's tenant's entries; entries that name no tenant (receipt
entries before this change) only where the log names a single tenant (decision
0089-audit-per-tenant). Two servers, one per tenant, on the same stores, both backends.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from audit.check import check_upload
from tests.api.conftest import PLANNER, bearer, grant, interaction, tenant_servers
from tests.conftest import OTHER_TENANT
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof


def _tenants(entries: list[dict[str, Any]]) -> set[Any]:
    return {e.get("tenant") for e in entries}


def _entries(http: httpx.Client, key: str, **body: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor = None
    while True:
        answer = http.post(
            "/v1/audit/entries", headers=bearer(key), json={**body, "cursor": cursor, "limit": 200}
        )
        assert answer.status_code == 200, answer.text
        page = answer.json()
        out += [item["entry"] for item in page["items"]]
        cursor = page.get("next_cursor")
        if not cursor:
            return out


def _receipts(http: httpx.Client, key: str) -> list[str]:
    answer = http.post("/v1/audit/receipts", headers=bearer(key), json={"limit": 200})
    assert answer.status_code == 200, answer.text
    return [r["receipt_id"] for r in answer.json()["items"]]


def _export(http: httpx.Client, key: str) -> str:
    answer = http.post("/v1/audit/export", headers=bearer(key), json={"format": "jsonl"})
    assert answer.status_code == 200, answer.text
    return answer.text


def _erase_in_a(http: httpx.Client, planner: str, operator: str) -> dict[str, Any]:
    grant(http, planner, "alice")
    captured = http.post(
        "/v1/captures",
        headers=bearer(planner),
        json={"subject": "alice", **interaction("I like tea")},
    )
    assert captured.status_code in (200, 201, 202), captured.text
    erased = http.post(
        "/v1/governance/erasures/subject", headers=bearer(operator), json={"subject": "alice"}
    )
    assert erased.status_code == 200, erased.text
    return dict(erased.json()["receipt"])


def test_an_auditor_of_another_tenant_reads_none_of_its_entries(
    kernel: Uprof, keys: ApiKeyStore, other: tuple[Uprof, ApiKeyStore]
) -> None:
    other_kernel, other_keys = other
    a_planner = keys.create(PLANNER).token
    a_auditor = keys.create(PLANNER, ["app", "operator"]).token
    b_auditor = other_keys.create(PLANNER, ["app", "operator"]).token
    with tenant_servers(kernel, keys, other) as (a_live, b_live, a, b):
        receipt = _erase_in_a(a, a_planner, a_auditor)
        a_seen = _entries(a, a_auditor)
        b_seen = _entries(b, b_auditor)
        a_receipts, b_receipts = _receipts(a, a_auditor), _receipts(b, b_auditor)
        a_export, b_export = _export(a, a_auditor), _export(b, b_auditor)
        leaf = receipt["inclusion"]["leaf_index"]
        size = receipt["inclusion"]["tree_size"]
        with httpx.Client(base_url=a_live.url, timeout=60) as console:
            console.post("/console/login", data={"api_key": a_auditor})
            a_search = console.get("/console", params={"action": "erasure.requested"})
        with httpx.Client(base_url=b_live.url, timeout=60) as console:
            console.post("/console/login", data={"api_key": b_auditor})
            b_search = console.get("/console", params={"action": "erasure.requested"})
            b_console_receipts = console.get("/console/receipts")
            b_console_export = console.get("/console/audit/export")
        a_proof = a.post(
            "/v1/audit/proof",
            headers=bearer(a_auditor),
            json={"old_size": size, "leaf_index": leaf},
        )
        b_proof = b.post(
            "/v1/audit/proof",
            headers=bearer(b_auditor),
            json={"old_size": size, "leaf_index": leaf},
        )
        beyond = b.post(
            "/v1/audit/proof",
            headers=bearer(b_auditor),
            json={"old_size": size, "leaf_index": 10**9},
        )

    # A's own reads are whole: its erasure's entries and its receipt.
    assert {"erasure.requested", "erasure.receipt"} <= {e["action"] for e in a_seen}
    assert receipt["body"]["receipt_id"] in a_receipts
    assert receipt["body"]["receipt_id"] in a_export
    # The stores hold two tenants: A's export too is filtered on its tenant.
    assert json.loads(a_export.splitlines()[0])["filter"] == {"tenant": "default"}
    assert a_proof.status_code == 200, a_proof.text
    # B's: nothing of A's, on every path.
    assert b_seen and _tenants(b_seen) == {OTHER_TENANT}, _tenants(b_seen)
    assert "erasure.requested" not in {e["action"] for e in b_seen}
    assert b_receipts == []
    b_lines = [json.loads(line) for line in b_export.splitlines()]
    b_exported = [r["entry"] for r in b_lines if r["kind"] == "entry"]
    assert receipt["body"]["receipt_id"] not in b_export
    assert '"tenant":"default"' not in b_export, "B's export carries A's entries"
    assert b_exported and _tenants(b_exported) == {OTHER_TENANT}
    # The compliance console's search, receipts page and export: the same.
    receipt_id = receipt["body"]["receipt_id"]
    for answer in (b_search, b_console_receipts, b_console_export):
        assert answer.status_code == 200, answer.text
        assert receipt_id not in answer.text and '"tenant":"default"' not in answer.text
    assert "<tr><td>" in a_search.text  # A's search finds A's erasure
    assert "<tr><td>" not in b_search.text  # B's finds none: B erased nobody
    assert b_console_export.text.startswith('{"checkpoint"')
    assert json.loads(b_console_export.text.splitlines()[0])["filter"] == {"tenant": OTHER_TENANT}
    # B's export is a tenant-filtered export, and it verifies.
    header = b_lines[0]
    assert header["filter"] == {"tenant": OTHER_TENANT} and header["filtered"] is True
    log = other_kernel.audit_log
    checked = check_upload(b_export.encode(), "export", log.public_key, log.origin)
    assert checked.ok, checked
    # A proof of one of A's entries is refused as a missing one is: same status, same shape.
    assert b_proof.status_code == beyond.status_code == 422, b_proof.text
    refused = json.dumps(b_proof.json()).replace(f"leaf_index {leaf} ", "leaf_index N ")
    missing = json.dumps(beyond.json()).replace(f"leaf_index {10**9} ", "leaf_index N ")
    assert refused == missing
