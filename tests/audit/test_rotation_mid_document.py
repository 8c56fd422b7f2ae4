"""Review of 0110: a document signed while another process rotates the audit key.

A receipt, an export and a proof each name one key (``issuer.key_id``, ``key_id`` and
``note_key_id``) and carry a checkpoint. They took that key once, then signed the
checkpoint with whatever key was current a moment later: across a rotation the document
named the old key and carried a checkpoint signed by the new one, and a verifier holding
the key the document names (the old key, pinned, no history yet) refused it. The key
source below stands for the rotation by another process between the two reads."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from audit.export import export_jsonl
from audit.proofs import build_proof, verify_proof
from audit.receipts import new_commitment_nonce, verify_receipt
from audit.verify import verify_export
from tests.audit.conftest import ORIGIN, audit_log_on
from tests.audit.test_log import fill
from tests.audit.test_receipts import issue


class RotatedAfterFirstUse:
    """The current key is ``old`` at the first read and ``new`` from then on (another
    process rotated in between); both are trusted (the endorsed history)."""

    def __init__(self) -> None:
        self.old, self.new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
        self.reads = 0

    def current(self) -> Ed25519PrivateKey:
        self.reads += 1
        return self.old if self.reads == 1 else self.new

    def trusted(self) -> Sequence[Ed25519PublicKey]:
        return (self.old.public_key(), self.new.public_key())


def test_a_receipt_issued_across_a_rotation_verifies_with_the_key_it_names(
    engine: sa.Engine,
) -> None:
    keys = RotatedAfterFirstUse()
    log = audit_log_on(engine, keys)
    fill(log, 5)
    keys.reads = 0
    receipt = issue(log, new_commitment_nonce())
    verify_receipt(receipt, keys.old.public_key(), origin=ORIGIN)


def test_an_export_written_across_a_rotation_verifies_with_the_key_it_names(
    engine: sa.Engine, tmp_path: Path
) -> None:
    keys = RotatedAfterFirstUse()
    log = audit_log_on(engine, keys)
    fill(log, 5)
    keys.reads = 0
    export_jsonl(log, tmp_path / "trail.jsonl")
    verify_export(tmp_path / "trail.jsonl", keys.old.public_key(), ORIGIN)


def test_a_proof_built_across_a_rotation_verifies_with_the_key_it_names(
    engine: sa.Engine,
) -> None:
    keys = RotatedAfterFirstUse()
    log = audit_log_on(engine, keys)
    fill(log, 5)
    from audit.checkpoint import sign_checkpoint

    trusted = sign_checkpoint(keys.old, ORIGIN, 3, log.root(3))
    keys.reads = 0
    proof = build_proof(log, old_size=3)
    verify_proof(proof, keys.old.public_key(), ORIGIN, trusted=trusted)
