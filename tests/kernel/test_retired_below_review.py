"""Review of decision 0175-retired-below, as an outside attacker: the restore of a backup
whose manifest nothing but the operator vouches for (a retired key's, an unsigned one),
and what ``--allow-unsigned`` still checks. Both backends."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from audit.keyring import KEY_FILE, StaticSigningKeys
from audit.keys import key_id, load_signing_key
from audit.tables import create_tables
from domain.principal import Principal
from tests.audit.conftest import audit_log_on
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running, settings_for, sign_backup_manifest
from tests.kernel.test_admin_audit import cli_for
from tests.kernel.test_keys_apart import ALICE, BOB, canaries, fill
from uprof.backends import backend_for
from uprof.facade import Facade


def _restored_entries(settings: Any, clock: FakeClock) -> list[dict[str, Any]]:
    with running(settings, clock) as k:
        return [json.loads(e.entry_json) for e in k.audit_log.entries(action="backup.restored")]


def _backup_then_rotate(settings: Any, clock: FakeClock, folder: Path) -> Any:
    """A backup taken at the rotation point (signed by the key about to retire), then the
    key rotated out and the log grown; return the retired private key."""
    from uprof.services.backup import backup

    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
    backup(settings, folder)
    retired = load_signing_key(settings.key_path / KEY_FILE)
    with running(settings, clock) as k:
        Facade(k, Principal.local_operator(k.subjects.tenant)).rotate_audit_key()
        fill(k, "bob", BOB)
    return retired


def _forged_receipt(
    tmp_path: Path,
    receipt: dict[str, Any],
    leaked: Any,
    origin: str,
    copied: list[dict[str, Any]],
) -> Path:
    """``receipt`` (its body signed by the key now retired) moved into a fork that the
    leaked key signs: the real entries up to its own, then a made-up one; its inclusion
    and checkpoint are the fork's. Written to ``forged.json``; return the path."""
    fork = sa.create_engine(f"sqlite:///{tmp_path / 'fork.sqlite'}")
    create_tables(fork, backend_for(fork))
    forger = audit_log_on(fork, StaticSigningKeys(leaked), origin)
    forger.append_many([*copied, {"action": "consent.granted", "subject_ref": "sub_forged"}])
    leaf, size = receipt["inclusion"]["leaf_index"], forger.size()
    forged = {
        **receipt,
        "checkpoint": forger.checkpoint(),
        "inclusion": {
            "leaf_index": leaf,
            "tree_size": size,
            "hashes": [base64.b64encode(h).decode() for h in forger.inclusion_proof(leaf, size)],
        },
    }
    fork.dispose()
    path = tmp_path / "forged.json"
    path.write_text(json.dumps(forged))
    return path


def test_mj_a_restore_the_operator_vouched_for_says_so_in_its_audit_entry(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Bug MJ. ``uprof restore --allow-unsigned`` takes a manifest a retired key signed
    (LM: that signature binds nothing a leaked copy of the key could not sign) or an
    unsigned one, on the operator's word alone. Its ``backup.restored`` entry was the
    same as a restore the deployment's key vouched for: the trail could not tell which
    restores rested on an operator's word, nor which retired key's manifest. Now the
    entry names it: ``decision`` ``operator-vouched``, ``rule`` ``manifest-retired-key``
    (with the key's ``audit_key_id``) or ``manifest-unsigned``; a restore whose manifest
    the current key signed names none of them, ``--allow-unsigned`` given or not."""
    from uprof.services.backup import backup, restore

    settings = settings_for(backend)
    retired = _backup_then_rotate(settings, clock, tmp_path / "old")
    restore(settings, tmp_path / "old", allow_unsigned=True)
    (by_retired,) = _restored_entries(settings, clock)
    assert by_retired.get("decision") == "operator-vouched", by_retired
    assert by_retired.get("rule") == "manifest-retired-key", by_retired
    assert by_retired.get("audit_key_id") == key_id(retired), by_retired

    # The same backup, its signature removed: unsigned, on the operator's word too.
    manifest_path = tmp_path / "old" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["signature"]
    manifest_path.write_text(json.dumps(manifest))
    restore(settings, tmp_path / "old", allow_unsigned=True)
    unsigned = _restored_entries(settings, clock)[-1]
    assert unsigned.get("decision") == "operator-vouched", unsigned
    assert unsigned.get("rule") == "manifest-unsigned", unsigned
    assert "audit_key_id" not in unsigned

    # A backup the current key signed: its signature vouched, the flag changes nothing.
    backup(settings, tmp_path / "new")
    restore(settings, tmp_path / "new", allow_unsigned=True)
    signed = _restored_entries(settings, clock)[-1]
    assert {"decision", "rule", "audit_key_id"}.isdisjoint(signed), signed


def test_allow_unsigned_still_checks_a_retired_keys_signature_and_the_files(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Held (review of 0175): ``--allow-unsigned`` waives the retired key's range, not
    its signature nor the files' hashes. A manifest edited after the retired key signed
    it, a backup file changed under a manifest the retired key signed again, and a
    manifest of a longer log than the key's point (KO) are refused with the flag, and
    nothing was restored."""
    from uprof.services.backup import BackupError, restore

    settings = settings_for(backend)
    retired = _backup_then_rotate(settings, clock, tmp_path / "bk")
    manifest_path = tmp_path / "bk" / "manifest.json"
    original = manifest_path.read_text()

    manifest = json.loads(original)
    manifest["created_at"] = "2020-01-01T00:00:00+00:00"  # after the signature
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(BackupError, match="does not match its signature"):
        restore(settings, tmp_path / "bk", allow_unsigned=True)

    manifest_path.write_text(original)
    listed = sorted(json.loads(original)["files"])[0]
    target = tmp_path / "bk" / listed
    saved = target.read_bytes()
    target.write_bytes(saved + b"\0")
    sign_backup_manifest(tmp_path / "bk", retired)  # the leaked key signs again
    with pytest.raises(Exception, match=r"(?i)sha-?256|hash|changed|does not match"):
        restore(settings, tmp_path / "bk", allow_unsigned=True)
    target.write_bytes(saved)

    manifest = json.loads(original)
    manifest["audit"]["entries"] += 100  # past the retired key's point
    manifest_path.write_text(json.dumps(manifest))
    sign_backup_manifest(tmp_path / "bk", retired)
    with pytest.raises(BackupError, match="rotated out before that"):
        restore(settings, tmp_path / "bk", allow_unsigned=True)
    assert _restored_entries(settings, clock) == []


def verify_trail(run: Any, folder: Path, fmt: str = "jsonl") -> list[str]:
    """Export the whole trail (``fmt``: jsonl or csv) with the CLI ``run``, and beside it
    the key history and the public key, into ``folder``; return the ``uprof audit
    verify`` arguments that check that trail with both (a test adds its
    ``--trusted-checkpoint``)."""
    trail = folder / f"trail.{fmt}"
    run("audit", "export", "--format", fmt, "--out", str(trail))
    run("audit", "keys", "--out", str(folder / "keys.json"))
    run("audit", "public-key", "--out", str(folder / "key.pem"))
    return [
        "audit", "verify", str(trail),
        "--public-key", str(folder / "key.pem"),
        "--key-history", str(folder / "keys.json"),
    ]  # fmt: skip


def _receipt_then_rotation(backend: Backend, clock: FakeClock, tmp_path: Path) -> tuple[Any, ...]:
    """Alice erased (her receipt in ``receipt.json``), bob filled after, then the audit key
    rotated out by the CLI: the CLI runner, the settings, the receipt, the retired key (as
    a leaked copy), the log's origin and the entries up to the receipt's (for a fork)."""
    run = cli_for(backend)
    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        receipt = k.erase_subject("alice").receipt
        fill(k, "bob", BOB)
        leaf = receipt["inclusion"]["leaf_index"]
        copied = [json.loads(e.entry_json) for e in k.audit_log.entries(tree_size=leaf + 1)]
        origin = k.audit_log.origin
    (tmp_path / "receipt.json").write_text(json.dumps(receipt))
    leaked = load_signing_key(settings.key_path / KEY_FILE)
    run("audit", "rotate-key")
    return run, settings, receipt, leaked, origin, copied


def test_mk_audit_prove_from_a_receipt_issued_before_a_rotation(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Bug MK. ``uprof audit prove --from receipt.json`` (prove the log only grew since a
    receipt someone holds) checked the receipt with ``verify_receipt`` without a rotation
    proof: a receipt the deployment honestly issued before its audit key was rotated out
    (below the key's point) was refused as "not a checkpoint of this log", though the
    command holds the log that proves it. Now it verifies with the log's proof, as
    ``POST /v1/audit/verify`` does, and the document it writes verifies offline against
    the receipt with the key history. A receipt of a fork the retired key signed is
    still refused: the same ``verify_receipt`` refuses it (KG, decision 0160-rotation-bound)."""
    run, settings, receipt, leaked, origin, copied = _receipt_then_rotation(
        backend, clock, tmp_path
    )
    with running(settings, clock) as k:
        fill(k, "carol", canaries("carol"))
        keys = k.audit_log.trusted_keys()
        point = keys.retired_at[receipt["body"]["issuer"]["key_id"]]
        assert receipt["inclusion"]["tree_size"] < point.tree_size  # below the point
    held = str(tmp_path / "receipt.json")
    run("audit", "prove", "--from", held, "--out", str(tmp_path / "p.json"))
    document = json.loads((tmp_path / "p.json").read_text())
    assert document["consistency"]["old_size"] == receipt["inclusion"]["tree_size"]
    run("audit", "keys", "--out", str(tmp_path / "keys.json"))
    run("audit", "public-key", "--out", str(tmp_path / "key.pem"))
    run(
        "audit", "verify-proof", str(tmp_path / "p.json"),
        "--public-key", str(tmp_path / "key.pem"),
        "--key-history", str(tmp_path / "keys.json"),
        "--trusted-checkpoint", str(tmp_path / "receipt.json"),
    )  # fmt: skip

    # The same receipt moved into a fork the leaked retired key signs (its entry at the
    # same leaf, one made-up entry after): its tree is not this log's; refused.
    _forged_receipt(tmp_path, receipt, leaked, origin, copied)
    out = " ".join(
        run(
            "audit", "prove", "--from", str(tmp_path / "forged.json"),
            "--out", str(tmp_path / "q.json"), code=1,
        ).split()
    )  # fmt: skip
    assert "does not extend" in out and "proof consistency" in out, out


def test_ml_a_receipt_issued_before_a_rotation_is_a_trusted_checkpoint_of_a_trail(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Bug ML. ``uprof audit verify trail --trusted-checkpoint receipt.json`` (the trail
    must extend the tree of a receipt the reader holds) checked the receipt with
    ``verify_receipt`` and no rotation proof: an honest receipt issued before the audit
    key's rotation (below its point) was refused, though its checkpoint note, handed in
    as a note, is taken (a reader's own note needs none: a forged one only makes the
    trail fail to extend it). Now the receipt's note is taken the same way, and the trail
    must extend it: a receipt moved into a fork the leaked key signs is refused, the
    whole trail does not extend it."""
    run, _settings, receipt, leaked, origin, copied = _receipt_then_rotation(
        backend, clock, tmp_path
    )
    (tmp_path / "receipt.note").write_text(receipt["checkpoint"])
    verify = [*verify_trail(run, tmp_path), "--trusted-checkpoint"]
    run(*verify, str(tmp_path / "receipt.note"))  # the note alone: taken on main too
    run(*verify, str(tmp_path / "receipt.json"))

    forged = _forged_receipt(tmp_path, receipt, leaked, origin, copied)
    out = " ".join(run(*verify, str(forged), code=1).split())
    assert "do not hash to the root of the trusted checkpoint" in out, out
