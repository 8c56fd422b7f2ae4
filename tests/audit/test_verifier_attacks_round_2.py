"""Attacks on what auditors and data subjects verify offline, by a party crafting the inputs
(decision XXXX-verifier-attacks). Random mutation is covered by test_export.py,
test_receipts.py and test_verifier_attacks.py; these are chosen inputs: a receipt shown as
another subject's or another tenant's, another deployment's key or history, two signed trees
that disagree, files that read one way to a person and another to the verifier, and the CLI's
verdict (its exit code and whether it says "verified") on each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from audit.checkpoint import sign_checkpoint
from audit.errors import VerificationError
from audit.export import export_jsonl
from audit.keyring import extend_history, genesis_history, parse_key_history
from audit.keys import public_key_pem
from audit.log import AuditLog
from audit.receipts import (
    NONCE_BYTES,
    issue_erasure_receipt,
    new_commitment_nonce,
    parse_receipt,
    subject_commitment,
    verify_receipt,
    verify_subject_commitment,
)
from audit.verify import verify_export
from tests.audit.conftest import ORIGIN
from tests.audit.test_log import fill
from tests.audit.test_verifier_attacks import ACTIONS, _shadow_log
from uprof.cli.main import app as cli

TIME = "2025-01-01T00:00:00.000000Z"


def issue_for(log: AuditLog, subject: str, nonce: bytes, tenant: str = "acme") -> dict[str, Any]:
    return issue_erasure_receipt(
        log,
        request_id="req-1",
        received_at="2025-01-01T09:00:00Z",
        basis="GDPR-Art.17(1)",
        scope="subject",
        tenant=tenant,
        subject_commitment=subject_commitment(subject, nonce),
        actions=ACTIONS,
        residual={"backup_retention_days": 35},
    )


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(cli, ["audit", *args])


def refused(result: Any) -> bool:
    """A CLI refusal: exit code 1 with a reason (no traceback), never a word of success."""
    return (
        result.exit_code == 1
        and isinstance(result.exception, SystemExit)
        and "verified" not in result.output.lower().replace("does not verify", "")
    )


# --- A receipt shown as another subject's ----------------------------------------------------


def test_a_receipt_names_one_subject_not_every_prefix_of_it(
    sqlite_log: AuditLog, tmp_path: Path
) -> None:
    """SHA-256(subject_id || nonce) with a nonce of any length lets the bytes move across
    the boundary: the receipt of "ana1" (nonce N) also matched "ana" with nonce "1" || N, and
    "an" with "a1" || N, so one erasure could be handed to several subjects as theirs."""
    nonce = new_commitment_nonce()
    receipt = issue_for(sqlite_log, "ana1", nonce)
    verify_subject_commitment(receipt, "ana1", nonce)  # the subject's own check passes
    for claimed, moved in (("ana", b"1"), ("an", b"a1"), ("", b"ana1")):
        with pytest.raises(VerificationError):
            verify_subject_commitment(receipt, claimed, moved + nonce)

    path = tmp_path / "receipt.json"
    path.write_text(json.dumps(receipt))
    key = tmp_path / "audit.pem"
    key.write_bytes(public_key_pem(sqlite_log.public_key))
    pinned = ["--public-key", str(key), "--origin", ORIGIN]
    own = run_cli("verify-receipt", str(path), *pinned, "--subject", "ana1", "--nonce", nonce.hex())
    assert own.exit_code == 0 and "subject matches" in own.output, own.output
    other = run_cli(
        "verify-receipt", str(path), *pinned, "--subject", "ana", "--nonce", (b"1" + nonce).hex()
    )
    assert refused(other), other.output
    assert "subject matches" not in other.output


def test_the_issuer_commits_with_a_nonce_of_the_one_length(sqlite_log: AuditLog) -> None:
    """What the verifier refuses, the issuer never makes (the same function decides)."""
    for size in (16, NONCE_BYTES - 1, NONCE_BYTES + 1):
        with pytest.raises(Exception, match=f"{NONCE_BYTES} random bytes"):
            subject_commitment("ana", os.urandom(size))
    assert len(new_commitment_nonce()) == NONCE_BYTES


# --- A receipt shown as another tenant's -----------------------------------------------------


def test_a_receipt_of_another_tenant_is_told_apart(sqlite_log: AuditLog, tmp_path: Path) -> None:
    """Tenants on one set of stores share the log, its key and its origin: a receipt of
    tenant globex verified for acme's auditor with "receipt verified" and no word of the
    tenant, and nothing could ask for acme's. The verdict names the tenant, and --tenant
    (``verify_receipt(..., tenant=)``) refuses another's."""
    receipt = issue_for(sqlite_log, "ana", new_commitment_nonce(), tenant="globex")
    verify_receipt(receipt, sqlite_log.public_key, origin=ORIGIN, tenant="globex")
    with pytest.raises(VerificationError, match="for tenant 'globex', not 'acme'"):
        verify_receipt(receipt, sqlite_log.public_key, origin=ORIGIN, tenant="acme")

    path = tmp_path / "receipt.json"
    path.write_text(json.dumps(receipt))
    key = tmp_path / "audit.pem"
    key.write_bytes(public_key_pem(sqlite_log.public_key))
    pinned = ["--public-key", str(key), "--origin", ORIGIN]
    shown = run_cli("verify-receipt", str(path), *pinned)
    assert shown.exit_code == 0 and 'tenant "globex"' in " ".join(shown.output.split())
    asked = run_cli("verify-receipt", str(path), *pinned, "--tenant", "acme")
    assert refused(asked) and "not 'acme'" in " ".join(asked.output.split()), asked.output
    assert run_cli("verify-receipt", str(path), *pinned, "--tenant", "globex").exit_code == 0
