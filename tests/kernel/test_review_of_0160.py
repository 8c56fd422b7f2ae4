"""Review of decision 0160-rotation-bound (decision 0165-review-of-0160), on both backends.

0160 made a receipt issued before an audit key rotation verify offline, with the key
history, only beside a "rotation proof" (the log's consistency proof from the receipt's
checkpoint to the point where its key was rotated out), and left nothing that hands the
proof out: a data subject's or auditor's receipt was refused offline, and only the
operator's Python API could compute it. Now ``uprof audit rotation-proof`` and
``POST /v1/audit/rotation-proof`` (tests/api/test_review_of_0160_rest.py) give it, through
the facade, as this tenant's, audited.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audit.keyring import KEY_FILE, trusted_keys
from audit.keys import load_signing_key, public_key_pem
from audit.receipts import verify_receipt
from domain.errors import InvalidInputError, PermissionDeniedError
from domain.principal import Principal, PrincipalKind
from tests.conftest import Backend, seed_policy_for
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, build_kernel, running, settings_for, sign_backup_manifest
from tests.kernel.test_admin_audit import cli_for
from tests.kernel.test_audit_key_rotation_processes import child
from tests.kernel.test_keys_apart import ALICE, BOB, fill
from uprof.facade import Facade
from uprof.kernel import Uprof


def _proofs_served(kernel: Uprof) -> list[dict[str, object]]:
    return [e.entry for e in kernel.audit_log.entries(action="audit.proof_served")]


def test_the_cli_hands_out_the_rotation_proof_an_old_receipt_needs_offline(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    run = cli_for(backend)
    with running(settings_for(backend), clock) as k:
        fill(k, "alice", ALICE)
        receipt = k.erase_subject("alice").receipt
        fill(k, "bob", BOB)  # the log grows past the receipt's checkpoint before the rotation
    receipt_file, proof_file = tmp_path / "receipt.json", tmp_path / "rotation-proof.json"
    receipt_file.write_text(json.dumps(receipt))
    run("audit", "public-key", "--out", str(tmp_path / "first.pem"))
    run("audit", "rotation-proof", str(receipt_file), "--out", str(proof_file))
    assert not proof_file.exists()  # before the rotation: its key is current, nothing needed
    run("audit", "rotate-key")
    run("audit", "keys", "--out", str(tmp_path / "keys.json"))
    check = [
        "audit",
        "verify-receipt",
        str(receipt_file),
        "--public-key",
        str(tmp_path / "first.pem"),
        "--key-history",
        str(tmp_path / "keys.json"),
    ]
    assert "rotation_proof" in run(*check, code=1)  # 0160: refused, naming the proof

    said = run("audit", "rotation-proof", str(receipt_file), "--out", str(proof_file))

    assert "rotation proof written" in said
    assert "receipt verified" in run(*check, "--rotation-proof", str(proof_file))
    history = json.loads((tmp_path / "keys.json").read_text())
    point = trusted_keys((tmp_path / "first.pem").read_bytes(), history).retired_at[
        receipt["body"]["issuer"]["key_id"]
    ]
    assert receipt["inclusion"]["tree_size"] < point.tree_size  # a real proof, not m = N
    with running(settings_for(backend), clock) as k:
        served = _proofs_served(k)[-1]
    assert served["counts"] == {
        "old_size": receipt["inclusion"]["tree_size"],
        "rotation_point": point.tree_size,
    }
    # A receipt edited by hand gets no proof (it is verified first).
    receipt["body"]["actions"] = receipt["body"]["actions"][:-1]
    receipt_file.write_text(json.dumps(receipt))
    run("audit", "rotation-proof", str(receipt_file), "--out", str(tmp_path / "x"), code=2)
    assert not (tmp_path / "x").exists()


def test_only_this_tenants_receipt_gets_a_proof_and_only_with_the_audit_right(
    kernel: Uprof, tmp_path: Path
) -> None:
    fill(kernel, "alice", ALICE)
    receipt = json.dumps(kernel.erase_subject("alice").receipt).encode()
    there = kernel.settings.model_copy(
        update={"tenant": "t2", "policy_path": seed_policy_for("t2", tmp_path)}
    )
    other = build_kernel(there, FakeClock())
    try:
        app_door = Facade(
            kernel,
            Principal(kernel.subjects.tenant, APP, "k1", PrincipalKind.APP, frozenset({"app"})),
        )
        with pytest.raises(PermissionDeniedError):
            app_door.receipt_rotation_proof(receipt)
        with pytest.raises(InvalidInputError, match="tenant"):
            Facade(other, Principal.local_operator("t2")).receipt_rotation_proof(receipt)
        own = Facade(kernel, Principal.local_operator(kernel.subjects.tenant))
        assert own.receipt_rotation_proof(receipt)["rotation_proof"] is None
        assert len(_proofs_served(kernel)) == 1
        assert _proofs_served(other) == [] or all(
            e["tenant"] == kernel.subjects.tenant for e in _proofs_served(other)
        )
    finally:
        other.close()


def test_a_running_server_finishes_a_rotation_killed_before_its_key_switch(
    backend: Backend, clock: FakeClock
) -> None:
    """Bug KN. A rotation killed (kill -9, a real process) after writing the history (its
    commit point) and before renaming the new key over the old: the history bounds the old
    key at N, but a process that had the key ring open kept signing with the old key file,
    so every checkpoint beyond N was refused (``AuditKeyError``): erasure receipts, exports
    and proofs failed in a long-running server until it was restarted. Now the ring
    finishes the killed rotation itself (its lock free: no rotation alive) and signs with
    the new key, which the history names."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        first_pem = public_key_pem(k.audit_log.public_key)
        k.audit_log.checkpoint()  # the server has its key ring open
        rotating = child(
            backend,
            """
            import signal
            import audit.keyring as keyring
            real_replace = os.replace
            def replace(src, dst):
                if Path(src).name == keyring.NEXT_KEY_FILE:
                    os.kill(os.getpid(), signal.SIGKILL)  # after the history, before the key
                return real_replace(src, dst)
            os.replace = replace
            kernel = build_kernel(settings_for(backend), FakeClock())
            kernel.rotate_audit_key(requested_by="operator:killed")
            """,
        )
        rotating.communicate(timeout=300)
        assert rotating.returncode == -9
        history = k.audit_key_history()
        assert history is not None and len(history["keys"]) == 2  # the commit point passed

        receipt = k.erase_subject("alice").receipt  # the log grew past N

        assert receipt["body"]["issuer"]["key_id"] == history["keys"][-1]["key_id"]
        origin = k.audit_log.origin
        assert k.audit_log.verify_integrity() == k.audit_log.size()
    verify_receipt(receipt, first_pem, origin=origin, key_history=history)


def test_a_backup_manifest_a_retired_key_signed_beyond_its_point_is_refused(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Bug KO. 0160 bounded a retired key's checkpoints, receipts and exports at the tree
    size N where it was rotated out, but ``uprof restore`` still took a backup manifest
    signed by any key of the history, whatever the log size the manifest names: whoever
    holds a leaked old key signed a backup of the log as it is now (past N), its files
    edited, and the restore took it. The manifest names its log size (``audit.entries``):
    a retired key's manifest beyond the key's point is refused, as its checkpoint is."""
    from uprof.services.backup import BackupError, backup, restore

    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        leaked = load_signing_key(settings.key_path / KEY_FILE)
        k.rotate_audit_key(requested_by="operator:test")
        fill(k, "bob", BOB)  # the log grows past the old key's point
    backup(settings, tmp_path / "bk")
    sign_backup_manifest(tmp_path / "bk", leaked)

    with pytest.raises(BackupError, match="rotated out"):
        restore(settings, tmp_path / "bk")
