"""Decision 0175-retired-below in a deployment, on both backends: an export or a proof
document taken before an audit key rotation verifies offline with the key history only
beside its rotation proof, which ``uprof audit rotation-proof`` (and the facade behind
``POST /v1/audit/rotation-proof``) now hands out for them as for receipts; the
deployment's own check (``POST /v1/audit/verify``, the console) asks its log itself; and
a note of a fork signed by the retired key gets no proof (bugs LK, LL)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.checkpoint import sign_checkpoint
from audit.keyring import KEY_FILE, StaticSigningKeys
from audit.keys import load_signing_key
from audit.tables import create_tables
from domain.errors import InvalidInputError
from domain.principal import Principal
from tests.audit.conftest import audit_log_on
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running, settings_for, sign_backup_manifest
from tests.kernel.test_admin_audit import cli_for
from tests.kernel.test_keys_apart import ALICE, BOB, canaries, fill
from uprof.backends import backend_for
from uprof.facade import Facade
from uprof.kernel import Uprof


def test_an_export_and_a_proof_taken_before_a_rotation_get_their_proof_and_verify(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    run = cli_for(backend)
    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        held = k.audit_log.checkpoint()
        fill(k, "bob", BOB)
    (tmp_path / "held.note").write_text(held)
    run("audit", "export", "--out", str(tmp_path / "trail.jsonl"))
    run("audit", "export", "--format", "csv", "--out", str(tmp_path / "trail.csv"))
    run("audit", "prove", "--from", str(tmp_path / "held.note"), "--out", str(tmp_path / "p.json"))
    run("audit", "public-key", "--out", str(tmp_path / "first.pem"))
    with running(settings, clock) as k:
        # The log grows after the export and the proof, before the key is rotated out.
        fill(k, "carol", canaries("carol"))
    run("audit", "rotate-key")
    run("audit", "keys", "--out", str(tmp_path / "keys.json"))
    pinned = [
        "--public-key", str(tmp_path / "first.pem"),
        "--key-history", str(tmp_path / "keys.json"),
    ]  # fmt: skip
    checks = {
        "trail.jsonl": ["audit", "verify", str(tmp_path / "trail.jsonl"), *pinned],
        "trail.csv": ["audit", "verify", str(tmp_path / "trail.csv"), *pinned],
        "p.json": [
            "audit", "verify-proof", str(tmp_path / "p.json"), *pinned,
            "--trusted-checkpoint", str(tmp_path / "held.note"),
        ],
    }  # fmt: skip
    for name, check in checks.items():
        refused = " ".join(run(*check, code=1).split())
        assert "uprof audit rotation-proof" in refused, refused
        proof_file = tmp_path / f"{name}.rotation-proof"
        said = run("audit", "rotation-proof", str(tmp_path / name), "--out", str(proof_file))
        assert "rotation proof written" in said
        assert "verified" in run(*check, "--rotation-proof", str(proof_file))

    with running(settings, clock) as k:
        # The deployment's own check asks its log for the proof (POST /v1/audit/verify).
        for name in ("trail.jsonl", "trail.csv"):
            assert k.verify_audit((tmp_path / name).read_bytes(), "export").ok
        served = [e.entry for e in k.audit_log.entries(action="audit.proof_served")]
        assert [e["counts"]["rotation_point"] for e in served[-3:]] == [
            served[-1]["counts"]["rotation_point"]
        ] * 3


def test_a_note_a_retired_key_signs_over_a_fork_gets_no_rotation_proof(
    kernel: Uprof, tmp_path: Path
) -> None:
    k = kernel
    door = Facade(k, Principal.local_operator(k.subjects.tenant))
    fill(k, "alice", ALICE)
    leaked = load_signing_key(k.settings.key_path / KEY_FILE)
    door.rotate_audit_key()
    fill(k, "bob", BOB)
    fork = sa.create_engine(f"sqlite:///{tmp_path / 'fork.sqlite'}")
    create_tables(fork, backend_for(fork))
    forger = audit_log_on(fork, StaticSigningKeys(leaked), k.audit_log.origin)
    forger.append({"action": "consent.granted", "subject_ref": "sub_forged"})
    note = forger.checkpoint()
    before = len(list(k.audit_log.entries(action="audit.proof_served")))
    with pytest.raises(InvalidInputError, match="a retired key's fork"):
        door.checkpoint_rotation_proof(note)
    # Nor a note of another key, nor something that is no note at all.
    stranger = sign_checkpoint(Ed25519PrivateKey.generate(), k.audit_log.origin, 1, b"\0" * 32)
    for junk in (stranger, "not a note", '{"body": 1, "checkpoint": "x"}'):
        with pytest.raises(InvalidInputError, match="checkpoint"):
            door.checkpoint_rotation_proof(junk)
    assert len(list(k.audit_log.entries(action="audit.proof_served"))) == before
    fork.dispose()


def test_lm_a_backup_manifest_a_retired_key_signs_at_or_below_its_point_is_refused(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Bug LM. KO (decision 0165-review-of-0160) refused a retired key's manifest of a
    log longer than the key's point; one at or below it was still restored on the key's
    word. A manifest names no root, so no rotation proof can bind it to the log the key
    stopped at: whoever holds a leaked copy of the key edits a backup taken before the
    rotation and signs it again, and the restore took it. Now such a backup is as good
    as unsigned: refused, naming --allow-unsigned, which restores it."""
    from uprof.services.backup import BackupError, backup, restore

    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
    backup(settings, tmp_path / "bk")  # at the point: signed by the key about to retire
    leaked = load_signing_key(settings.key_path / KEY_FILE)
    with running(settings, clock) as k:
        Facade(k, Principal.local_operator(k.subjects.tenant)).rotate_audit_key()
        fill(k, "bob", BOB)
    manifest_path = tmp_path / "bk" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["created_at"] = "2020-01-01T00:00:00+00:00"  # an edit the signature no longer sees
    manifest_path.write_text(json.dumps(manifest))
    sign_backup_manifest(tmp_path / "bk", leaked)

    with pytest.raises(BackupError, match="--allow-unsigned"):
        restore(settings, tmp_path / "bk")
    restore(settings, tmp_path / "bk", allow_unsigned=True)  # the operator vouches for it
    with running(settings, clock) as k:
        assert k.audit_log.verify_integrity() == k.audit_log.size()
