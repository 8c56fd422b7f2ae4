"""Audit signing key rotation (decision 0110-audit-key-rotation), on both backends.

Until this change the key could not be rotated: one pinned key, no history. A key file
replaced by hand left the stored checkpoints signed by the old key, so
``AuditLog.verify_integrity`` and ``uprof restore`` refused the log, backups signed by the
old key were refused, and receipts issued before verified only against the old public key.
Now a rotation is a command (``operate``), recorded on the log, and every key of the
endorsed history verifies what it signed, offline from the first public key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from audit._codec import b64encode
from audit.errors import VerificationError
from audit.keyring import HISTORY_FILE, KEY_FILE, trusted_keys, verify_key_history
from audit.keys import key_id, public_key_pem
from audit.receipts import verify_receipt
from audit.verify import verify_export
from domain.errors import PermissionDeniedError
from domain.principal import Principal, PrincipalKind
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, build_kernel, running, settings_for, sign_backup_manifest
from tests.kernel.test_admin_audit import cli_for
from tests.kernel.test_keys_apart import ALICE, BOB, fill
from uprof.facade import Facade
from uprof.kernel import Uprof
from uprof.services.backup import BackupError, backup, restore


def key_dir(backend: Backend) -> Path:
    return settings_for(backend).key_path


def signer(note: str, kernel: Uprof) -> str:
    """The id of the history key that signed a checkpoint note."""
    from audit.checkpoint import verify_checkpoint

    for key in kernel.audit_log.trusted_keys():
        try:
            verify_checkpoint(note, key, kernel.audit_log.origin)
        except VerificationError:
            continue
        return key_id(key)
    raise AssertionError("no key of the history signed the note")


def rotations(kernel: Uprof) -> list[dict[str, Any]]:
    return [e.entry for e in kernel.audit_log.entries(action="audit.key_rotated")]


def test_a_rotation_is_recorded_and_everything_signed_before_still_verifies(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    with running(settings_for(backend), clock) as k:
        first_pem = public_key_pem(k.audit_log.public_key)
        first_id = k.audit_log.key_id
        fill(k, "alice", ALICE)
        fill(k, "bob", BOB)
        old_receipt = k.erase_subject("alice").receipt
        k.export_audit(tmp_path / "before.jsonl")
        assert old_receipt["body"]["issuer"]["key_id"] == first_id

        done = Facade(k, Principal.local_operator(k.subjects.tenant)).rotate_audit_key()

        assert done["previous_key_id"] == first_id and done["seq"] == 1
        assert k.audit_log.key_id == done["key_id"] != first_id
        (entry,) = rotations(k)
        assert entry["audit_key_id"] == done["key_id"]
        assert entry["previous_audit_key_id"] == first_id
        assert entry["audit_key_seq"] == 1
        assert entry["requested_by"] == entry["principal"] == "operator:local#cli"
        assert "reason_code" not in entry
        # The log holds checkpoints by both keys: the integrity check accepts both.
        signers = {signer(c.note, k) for c in k.audit_log.checkpoints()}
        assert signers == {first_id, done["key_id"]}
        assert k.audit_log.verify_integrity() == k.audit_log.size()

        new_receipt = k.erase_subject("bob").receipt
        assert new_receipt["body"]["issuer"]["key_id"] == done["key_id"]
        k.export_audit(tmp_path / "after.jsonl")
        history = k.audit_key_history()
        # The deployment's own verification (POST /v1/audit/verify) takes both.
        for receipt in (old_receipt, new_receipt):
            assert k.verify_audit(json.dumps(receipt).encode(), "receipt").ok
        assert k.verify_audit((tmp_path / "before.jsonl").read_bytes(), "export").ok
        assert k.verify_audit((tmp_path / "after.jsonl").read_bytes(), "export").ok
        origin = k.audit_log.origin
        # The old key was rotated out after the old receipt's checkpoint: offline, with the
        # history, that receipt needs the log's proof up to the rotation point (bug KG).
        point = trusted_keys(first_pem, history).retired_at[first_id].tree_size
        old_size = old_receipt["inclusion"]["tree_size"]
        rotation_proof = [b64encode(h) for h in k.audit_log.consistency_proof(old_size, point)]
        # So does the export taken before the rotation (bug LK, decision 0175-retired-below).
        export_size = json.loads((tmp_path / "before.jsonl").read_text().split("\n")[0])
        export_proof = [
            b64encode(h) for h in k.audit_log.consistency_proof(export_size["tree_size"], point)
        ]

    # Offline, with only the FIRST public key and the published history.
    verify_receipt(new_receipt, first_pem, origin=origin, key_history=history)
    verify_receipt(
        old_receipt, first_pem, origin=origin, key_history=history, rotation_proof=rotation_proof
    )
    with pytest.raises(VerificationError, match="rotation_proof"):
        verify_receipt(old_receipt, first_pem, origin=origin, key_history=history)
    verify_export(tmp_path / "after.jsonl", first_pem, origin, key_history=history)
    verify_export(
        tmp_path / "before.jsonl",
        first_pem,
        origin,
        key_history=history,
        rotation_proof=export_proof,
    )
    with pytest.raises(VerificationError, match="rotation_proof"):
        verify_export(tmp_path / "before.jsonl", first_pem, origin, key_history=history)
    # Without the history, the first key alone does not vouch for the new key.
    with pytest.raises(VerificationError, match=r"issuer\.key_id"):
        verify_receipt(new_receipt, first_pem, origin=origin)
    with pytest.raises(VerificationError, match="key_id"):
        verify_export(tmp_path / "after.jsonl", first_pem, origin)
    verify_receipt(old_receipt, first_pem, origin=origin)  # as before the change


def test_a_signature_by_a_key_no_history_endorses_is_refused(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """A stranger key, even handed in with a history of its own, verifies nothing."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from audit.export import export_jsonl
    from audit.keyring import genesis_history
    from audit.log import AuditLog

    with running(settings_for(backend), clock) as k:
        fill(k, "alice", ALICE)
        first_pem = public_key_pem(k.audit_log.public_key)
        origin = k.audit_log.origin
        stranger = Ed25519PrivateKey.generate()
        forged_log = AuditLog(k.views_engine, stranger, origin, backend=k.audit_log._backend)
        with (tmp_path / "forged.jsonl").open("w", encoding="utf-8") as out:
            export_jsonl(forged_log, out)
        assert not k.verify_audit((tmp_path / "forged.jsonl").read_bytes(), "export").ok
        with pytest.raises(VerificationError):
            verify_export(
                tmp_path / "forged.jsonl",
                first_pem,
                origin,
                key_history=genesis_history(stranger, "2026-12-05T00:00:00.000000Z"),
            )
        # The stranger's checkpoint stored in the log: the integrity check refuses it.
        assert forged_log.checkpoint()
        with pytest.raises(VerificationError, match="no signature by the pinned key"):
            k.audit_log.verify_integrity()


def test_restore_after_rotations_accepts_a_backup_signed_by_the_old_key(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        first = k.audit_log.key_id
    backup(settings, tmp_path / "bk")
    manifest = json.loads((tmp_path / "bk" / "manifest.json").read_text())
    assert manifest["signature"]["key_id"] == first
    with running(settings, clock) as k:
        k.rotate_audit_key(requested_by="operator:test")
        k.rotate_audit_key(requested_by="operator:test")
        assert len(k.audit_log.trusted_keys()) == 3
    # Its signature verifies, but a key rotated out since vouches for no manifest on its
    # own (a leaked copy signs any): restored on the operator's word (bug LM, decision
    # 0175-retired-below; until then the old key's signature sufficed).
    with pytest.raises(BackupError, match="--allow-unsigned"):
        restore(settings, tmp_path / "bk")
    restore(settings, tmp_path / "bk", allow_unsigned=True)  # verify_integrity runs inside
    with running(settings, clock) as k:
        assert k.audit_log.verify_integrity() == k.audit_log.size()
        assert key_id(k.audit_log.signing_key()) != first
        # The live log was kept or taken from the backup: either way every rotation is on it.
        assert [e["audit_key_seq"] for e in rotations(k)] == [1, 2]


def test_a_backup_signed_by_a_key_outside_the_history_is_refused(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
    backup(settings, tmp_path / "bk")
    sign_backup_manifest(tmp_path / "bk", Ed25519PrivateKey.generate())
    with pytest.raises(BackupError, match="another key"):
        restore(settings, tmp_path / "bk")


def test_rotation_needs_an_operator(kernel: Uprof) -> None:
    app_door = Facade(
        kernel, Principal(kernel.subjects.tenant, APP, "k1", PrincipalKind.APP, frozenset({"app"}))
    )
    before = kernel.audit_log.key_id
    with pytest.raises(PermissionDeniedError):
        app_door.rotate_audit_key()
    assert kernel.audit_log.key_id == before
    assert rotations(kernel) == []


def test_the_cli_rotates_publishes_the_history_and_verifies_old_receipts(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    run = cli_for(backend)
    with running(settings_for(backend), clock) as k:
        fill(k, "alice", ALICE)
        receipt = k.erase_subject("alice").receipt
    (tmp_path / "receipt.json").write_text(json.dumps(receipt))
    run("audit", "public-key", "--out", str(tmp_path / "first.pem"))
    done = json.loads(run("audit", "rotate-key", "--json"))
    assert done["seq"] == 1
    run("audit", "keys", "--out", str(tmp_path / "keys.json"))
    history = json.loads((tmp_path / "keys.json").read_text())
    assert [r["key_id"] for r in history["keys"]] == [done["previous_key_id"], done["key_id"]]
    assert json.loads((key_dir(backend) / HISTORY_FILE).read_text()) == history
    run("audit", "export", "--out", str(tmp_path / "trail.jsonl"))
    pem = str(tmp_path / "first.pem")
    hist = ["--key-history", str(tmp_path / "keys.json")]
    run("audit", "verify", str(tmp_path / "trail.jsonl"), "--public-key", pem, *hist)
    run("audit", "verify", str(tmp_path / "trail.jsonl"), "--public-key", pem, code=1)
    run("audit", "verify-receipt", str(tmp_path / "receipt.json"), "--public-key", pem, *hist)
    run("audit", "verify-receipt", str(tmp_path / "receipt.json"), "--public-key", pem)
    # A history edited by hand (a key dropped) fails the verification.
    history["keys"][1]["endorsement"] = None
    (tmp_path / "bad.json").write_text(json.dumps(history))
    bad = ["--key-history", str(tmp_path / "bad.json")]
    run("audit", "verify", str(tmp_path / "trail.jsonl"), "--public-key", pem, *bad, code=1)


def test_a_key_folder_whose_key_was_replaced_by_hand_does_not_open(
    backend: Backend, clock: FakeClock
) -> None:
    """The old failure mode (a pem swapped by hand) now stops the start with a clear
    message instead of an integrity failure later: a key no history names signs nothing."""
    import os

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from audit.errors import AuditKeyError

    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
    pem = key_dir(backend) / KEY_FILE
    pem.unlink()
    pem.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    os.chmod(pem, 0o600)
    with pytest.raises(AuditKeyError, match="names key"):
        build_kernel(settings, clock)


def test_the_history_file_verifies_from_the_first_key(backend: Backend, clock: FakeClock) -> None:
    with running(settings_for(backend), clock) as k:
        first = k.audit_log.public_key
        for _ in range(3):
            k.rotate_audit_key(requested_by="operator:test")
        document = json.loads((key_dir(backend) / HISTORY_FILE).read_text())
        verified = verify_key_history(document, first)
        assert verified.current_key_id == k.audit_log.key_id
        assert [e["audit_key_seq"] for e in rotations(k)] == [1, 2, 3]
        assert k.audit_log.verify_integrity() == k.audit_log.size()
