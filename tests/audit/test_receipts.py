"""Erasure receipts: issue, verify offline, and fail after any single change."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from hashlib import sha256
from typing import Any

import pytest
import rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.errors import AuditEntryError, VerificationError
from audit.keys import public_key_pem
from audit.log import AuditLog
from audit.merkle import leaf_hash
from audit.receipts import (
    RECEIPT_ACTION,
    issue_erasure_receipt,
    new_commitment_nonce,
    receipt_log_entry,
    subject_commitment,
    verify_receipt,
    verify_subject_commitment,
)
from tests.audit.conftest import ORIGIN
from tests.audit.test_log import fill

SUBJECT_ID = "0b7f6c1e-1d2a-4c55-9a65-7f1f0b6d2e11"


def issue(log: AuditLog, nonce: bytes) -> dict[str, Any]:
    return issue_erasure_receipt(
        log,
        request_id="req-42",
        received_at="2025-01-01T09:00:00Z",
        basis="GDPR Art. 17(1)(b)",
        scope={"categories": "all"},
        tenant="acme",
        subject_commitment=subject_commitment(SUBJECT_ID, nonce),
        actions=[
            {"type": "tombstone_appended", "stream": "s-1", "version": 17, "notification_id": 901},
            {
                "type": "dek_destroyed",
                "dek_commitment": sha256(b"dek").hexdigest(),
                "key_version": 2,
                "at": "2025-01-01T09:00:01.000000Z",
            },
            {
                "type": "projection_purged",
                "name": "attributes",
                "tracking_position": 902,
                "rows": 12,
            },
            {"type": "embeddings_purged", "rows": 40},
            {"type": "cache_invalidated", "name": "slice-cache"},
        ],
        residual={
            "backup_retention_days": 30,
            "kek_rotation_days": 90,
            "note": "encrypted backups older than the last KEK rotation may hold wrapped keys",
        },
    )


@pytest.fixture
def nonce() -> bytes:
    return new_commitment_nonce()


def test_receipt_has_the_documented_shape_and_verifies_on_both_backends(
    log: AuditLog, nonce: bytes
) -> None:
    fill(log, 11)
    receipt = issue(log, nonce)
    assert set(receipt) == {"body", "body_sig", "inclusion", "checkpoint"}
    body = receipt["body"]
    assert body["type"] == "gov.erasure-receipt/v1"
    assert body["issuer"] == {"origin": ORIGIN, "key_id": log.key_id}
    assert receipt["inclusion"]["leaf_index"] == 11
    assert receipt["inclusion"]["tree_size"] == 12
    verify_receipt(receipt, log.public_key, origin=log.origin)
    verify_receipt(json.loads(json.dumps(receipt)), public_key_pem(log.public_key), origin=ORIGIN)
    verify_subject_commitment(receipt, SUBJECT_ID, nonce)
    with pytest.raises(VerificationError):
        verify_subject_commitment(receipt, "someone-else", nonce)
    with pytest.raises(VerificationError):
        verify_subject_commitment(receipt, SUBJECT_ID, new_commitment_nonce())


def test_the_log_holds_only_the_hash_of_the_body(sqlite_log: AuditLog, nonce: bytes) -> None:
    receipt = issue(sqlite_log, nonce)
    [stored] = list(sqlite_log.entries(action=RECEIPT_ACTION))
    assert stored.entry == {
        "action": RECEIPT_ACTION,
        "receipt_id": receipt["body"]["receipt_id"],
        "receipt_sha256": sha256(rfc8785.dumps(receipt["body"])).hexdigest(),
        "recorded_at": receipt["body"]["issued_at"],
        # the body's tenant, so that each tenant's auditors find their own receipts
        "tenant": receipt["body"]["subject"]["tenant"],
    }
    assert stored.leaf_hash == leaf_hash(rfc8785.dumps(receipt_log_entry(receipt["body"])))
    # The tenant, as every other entry names it (decision 0089-audit-per-tenant); still no
    # request details.
    assert "GDPR" not in stored.entry_json and "req-42" not in stored.entry_json


def test_receipt_stays_valid_as_the_log_grows(sqlite_log: AuditLog, nonce: bytes) -> None:
    receipt = issue(sqlite_log, nonce)
    fill(sqlite_log, 20)
    verify_receipt(receipt, sqlite_log.public_key, origin=sqlite_log.origin)


def test_wrong_key_or_origin_fails(sqlite_log: AuditLog, nonce: bytes) -> None:
    receipt = issue(sqlite_log, nonce)
    with pytest.raises(VerificationError):
        verify_receipt(receipt, Ed25519PrivateKey.generate().public_key(), origin=sqlite_log.origin)
    with pytest.raises(VerificationError, match="issued by log"):
        verify_receipt(receipt, sqlite_log.public_key, origin="other.example/log")


def _leaf_paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaf_paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaf_paths(item, (*path, i))
    else:
        yield path


def _mutate(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value[:-1] + ("A" if value[-1:] != "A" else "B") if value else "x"
    return "changed"


def test_changing_any_field_fails(sqlite_log: AuditLog, nonce: bytes) -> None:
    fill(sqlite_log, 6)
    receipt = issue(sqlite_log, nonce)
    paths = list(_leaf_paths(receipt))
    assert len(paths) > 30
    for path in paths:
        mutated = copy.deepcopy(receipt)
        target = mutated
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = _mutate(target[path[-1]])
        with pytest.raises(VerificationError):
            verify_receipt(mutated, sqlite_log.public_key, origin=sqlite_log.origin)
    # Structural changes: drop or add a key anywhere, reorder proof hashes, swap actions.
    for path in paths:
        mutated = copy.deepcopy(receipt)
        target = mutated
        for key in path[:-1]:
            target = target[key]
        if isinstance(target, dict):
            del target[path[-1]]
        else:
            target.append(target[path[-1]])
        with pytest.raises(VerificationError):
            verify_receipt(mutated, sqlite_log.public_key, origin=sqlite_log.origin)
    for container in (["body"], ["body", "issuer"], ["inclusion"], []):
        mutated = copy.deepcopy(receipt)
        target = mutated
        for key in container:
            target = target[key]
        target["extra"] = 1
        with pytest.raises(VerificationError):
            verify_receipt(mutated, sqlite_log.public_key, origin=sqlite_log.origin)
    mutated = copy.deepcopy(receipt)
    mutated["inclusion"]["hashes"].reverse()
    with pytest.raises(VerificationError):
        verify_receipt(mutated, sqlite_log.public_key, origin=sqlite_log.origin)


def test_any_single_byte_change_of_the_serialised_receipt_fails(
    sqlite_log: AuditLog, nonce: bytes
) -> None:
    fill(sqlite_log, 9)
    receipt = issue(sqlite_log, nonce)
    serialised = rfc8785.dumps(receipt)
    verify_receipt(json.loads(serialised), sqlite_log.public_key, origin=sqlite_log.origin)
    rng = random.Random(8785)
    # Every byte position once with a random different value, then random extra trials.
    positions = list(range(len(serialised))) + [rng.randrange(len(serialised)) for _ in range(1000)]
    for position in positions:
        blob = bytearray(serialised)
        blob[position] = (blob[position] + rng.randrange(1, 256)) % 256
        try:
            parsed = json.loads(bytes(blob))
        except ValueError:
            continue  # no longer JSON (or not UTF-8): rejected before verification
        with pytest.raises(VerificationError):
            verify_receipt(parsed, sqlite_log.public_key, origin=sqlite_log.origin)


def test_invalid_receipt_inputs_are_refused_at_issue(sqlite_log: AuditLog) -> None:
    with pytest.raises(AuditEntryError):
        issue_erasure_receipt(
            sqlite_log,
            request_id="r",
            received_at="2025-01-01T00:00:00Z",
            basis="b",
            scope="all",
            tenant="t",
            subject_commitment="not-a-hash",
            actions=[],
            residual={},
        )
    with pytest.raises(AuditEntryError, match="float"):
        issue_erasure_receipt(
            sqlite_log,
            request_id="r",
            received_at="2025-01-01T00:00:00Z",
            basis="b",
            scope="all",
            tenant="t",
            subject_commitment="0" * 64,
            actions=[{"type": "tombstone_appended"}, {"type": "embeddings_purged", "rows": 1.5}],
            residual={},
        )
    with pytest.raises(AuditEntryError, match="type"):
        issue_erasure_receipt(
            sqlite_log,
            request_id="r",
            received_at="2025-01-01T00:00:00Z",
            basis="b",
            scope="all",
            tenant="t",
            subject_commitment="0" * 64,
            actions=[{"type": "shredded_somehow"}],
            residual={},
        )
    assert sqlite_log.size() == 0


def test_subject_commitment_is_sha256_of_id_and_nonce() -> None:
    nonce = bytes(range(32))
    assert subject_commitment("abc", nonce) == sha256(b"abc" + nonce).hexdigest()
    with pytest.raises(AuditEntryError):
        subject_commitment("abc", b"short")
