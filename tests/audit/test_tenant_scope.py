"""Tenants sharing one log: each reader sees its own entries (decision 0089-audit-per-tenant).

``AuditLog.tenant_scope`` admits the entries naming the reader's tenant, and the entries
naming none (written before entries named their tenant) only while no entry names another
tenant; exports for a tenant of a shared log are filtered on ``tenant`` and verify; proofs
refuse another tenant's entry as they refuse an index beyond the log; receipts name their
tenant, and receipts issued before (no tenant in their entry) still verify. Both backends.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from audit import receipts
from audit.errors import VerificationError
from audit.export import export_jsonl, stream_export
from audit.log import AuditLog, TenantScope
from audit.proofs import build_proof, proof_bytes, verify_proof
from audit.receipts import verify_receipt
from audit.verify import verify_export
from domain.errors import InvalidInputError
from tests.audit.conftest import ORIGIN
from tests.audit.test_receipts import issue


def _entry(i: int, tenant: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"action": "consent.granted", "subject_ref": f"subj_{i}"}
    if tenant is not None:
        entry["tenant"] = tenant
    return entry


def _export_for(log: AuditLog, tenant: str) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    text = "".join(stream_export(log, tenant=tenant))
    lines = [json.loads(line) for line in text.splitlines()]
    return lines[0], [r["entry"] for r in lines if r["kind"] == "entry"], text


def test_a_single_tenant_log_reads_as_before_untagged_entries_included(log: AuditLog) -> None:
    log.append(_entry(0, None))  # written before entries named their tenant
    log.append_many([_entry(i, "acme") for i in range(1, 4)])
    scope = log.tenant_scope("acme")
    assert scope.untagged_below == 4
    assert [e.leaf_index for e in log.entries(scope=scope)] == [0, 1, 2, 3]
    header, entries, text = _export_for(log, "acme")
    whole = io.StringIO()
    export_jsonl(log, whole)
    assert header["filter"] == {} and header["filtered"] is False and len(entries) == 4
    report = verify_export(text.encode(), log.public_key, ORIGIN)
    assert report.entry_count == 4 and not report.filtered
    proof = build_proof(log, 1, leaf_index=0, scope=scope)
    assert proof["inclusion"]["leaf_index"] == 0


def test_tenants_sharing_a_log_see_their_own_entries_and_no_untagged_one(
    log: AuditLog,
) -> None:
    log.append(_entry(0, None))
    log.append_many([_entry(i, "acme" if i % 3 else "globex") for i in range(1, 10)])
    acme, globex = log.tenant_scope("acme"), log.tenant_scope("globex")
    assert acme.untagged_below == globex.untagged_below == 0
    assert [e.entry["tenant"] for e in log.entries(scope=acme)] == ["acme"] * 6
    assert [e.leaf_index for e in log.entries(scope=globex)] == [3, 6, 9]
    for tenant, count in (("acme", 6), ("globex", 3)):
        header, entries, text = _export_for(log, tenant)
        assert header["filter"] == {"tenant": tenant} and header["filtered"] is True
        assert {e["tenant"] for e in entries} == {tenant} and len(entries) == count
        report = verify_export(text.encode(), log.public_key, ORIGIN)
        assert report.filtered and report.filter == {"tenant": tenant}
    # A tenant filter the entries do not match fails verification.
    _, _, text = _export_for(log, "acme")
    forged = text.replace('"filter":{"tenant":"acme"}', '"filter":{"tenant":"globex"}')
    with pytest.raises(VerificationError):
        verify_export(forged.encode(), log.public_key, ORIGIN)
    # Another tenant's entry and the untagged one are refused as an index beyond the log.
    answers = []
    for leaf in (3, 0, 10**6):
        with pytest.raises(InvalidInputError) as refused:
            build_proof(log, 1, leaf_index=leaf, scope=acme)
        answers.append(str(refused.value).replace(f"leaf_index {leaf} ", "leaf_index N "))
    assert len(set(answers)) == 1, answers
    assert build_proof(log, 1, leaf_index=3, scope=globex)["inclusion"]["entry"]["tenant"] == (
        "globex"
    )


def test_a_page_of_a_small_tenant_reads_past_the_others_entries(log: AuditLog) -> None:
    log.append_many([_entry(i, "big") for i in range(2500)])
    log.append(_entry(2500, "small"))
    log.append_many([_entry(i, "big") for i in range(2501, 3000)])
    log.append(_entry(3000, "small"))
    scope = log.tenant_scope("small")
    assert [e.leaf_index for e in log.entries(scope=scope, page_size=2)] == [2500, 3000]
    first = next(iter(log.entries(scope=scope, page_size=1)))
    after = list(log.entries(scope=scope, after_leaf=first.leaf_index, page_size=1))
    assert [e.leaf_index for e in after] == [3000]


def test_the_scope_follows_appends_by_others(log: AuditLog) -> None:
    log.append_many([_entry(0, None), _entry(1, "acme")])
    assert log.tenant_scope("acme") == TenantScope("acme", 2)
    log.append(_entry(2, "acme"))
    assert log.tenant_scope("acme") == TenantScope("acme", 3)
    log.append(_entry(3, "globex"))  # a second tenant arrives: untagged entries are nobody's
    assert log.tenant_scope("acme") == TenantScope("acme", 0, shared=True)
    assert [e.leaf_index for e in log.entries(scope=log.tenant_scope("acme"))] == [1, 2]


def test_receipts_name_their_tenant_and_old_receipts_still_verify(
    log: AuditLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    nonce = b"n" * 32
    receipt = issue(log, nonce)
    stored = [e.entry for e in log.entries(action=receipts.RECEIPT_ACTION)]
    assert stored[-1]["tenant"] == "acme"
    verify_receipt(receipt, log.public_key, origin=ORIGIN)
    with monkeypatch.context() as m:  # as the issuer wrote receipts before 2026-12-05
        m.setattr(receipts, "receipt_log_entry", receipts.legacy_receipt_log_entry)
        old = issue(log, nonce)
    assert "tenant" not in next(
        e.entry for e in log.entries(action=receipts.RECEIPT_ACTION) if e.leaf_index == 1
    )
    verify_receipt(old, log.public_key, origin=ORIGIN)
    for tampered in (receipt, old):
        altered = json.loads(json.dumps(tampered))
        altered["body"]["subject"]["tenant"] = "globex"
        with pytest.raises(VerificationError):
            verify_receipt(altered, log.public_key, origin=ORIGIN)
    # A receipt's proof document checks the receipt's entry in either form.
    for held in (receipt, old):
        leaf = held["inclusion"]["leaf_index"]
        document = build_proof(log, held["inclusion"]["tree_size"], leaf_index=leaf)
        report = verify_proof(proof_bytes(document), log.public_key, ORIGIN, trusted=held)
        assert report.leaf_index == leaf


@pytest.mark.parametrize(("mine", "theirs"), [("acme", "ACME"), ("a_c", "abc"), ("ac", "acme")])
def test_a_tenant_whose_name_is_close_to_mine_is_another_tenant(
    log: AuditLog, mine: str, theirs: str
) -> None:
    """The single-tenant test compares names exactly: not case-folded, no wildcards, no
    prefixes (an entry of ``theirs`` makes the untagged entries nobody's)."""
    log.append_many([_entry(0, None), _entry(1, mine), _entry(2, theirs)])
    assert log.tenant_scope(mine) == TenantScope(mine, 0, shared=True)
    assert [e.leaf_index for e in log.entries(scope=log.tenant_scope(mine))] == [1]
