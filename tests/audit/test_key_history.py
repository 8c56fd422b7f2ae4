"""The audit key history (audit.keyring): a chain of keys, each endorsed by the one before
and accepting the records before it; verifiers accept any key of a history that names the
key they trust, and nothing else."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.checkpoint import sign_checkpoint, verify_checkpoint
from audit.errors import AuditKeyError, VerificationError
from audit.keyring import (
    HISTORY_FILE,
    KEY_FILE,
    NEXT_KEY_FILE,
    FileKeyRing,
    extend_history,
    genesis_history,
    record_sha256,
    trusted_keys,
    verify_key_history,
)
from audit.keys import key_id, load_signing_key

T0 = "2026-12-05T10:00:00.000000Z"
T1 = "2026-12-05T11:00:00.000000Z"
T2 = "2026-12-05T12:00:00.000000Z"


def chain(n: int) -> tuple[list[Ed25519PrivateKey], dict[str, Any]]:
    keys = [Ed25519PrivateKey.generate() for _ in range(n)]
    history = genesis_history(keys[0], T0)
    for i in range(1, n):
        history = extend_history(history, keys[i - 1], keys[i], [T0, T1, T2][min(i, 2)])
    return keys, history


@pytest.mark.parametrize("anchor", [0, 1, 2])
def test_a_history_verifies_from_any_of_its_keys(anchor: int) -> None:
    keys, history = chain(3)
    verified = verify_key_history(history, keys[anchor].public_key())
    assert verified.key_ids == tuple(key_id(k) for k in keys)
    assert verified.current_key_id == key_id(keys[2])


def test_a_key_outside_the_history_trusts_nothing_of_it() -> None:
    _, history = chain(3)
    with pytest.raises(VerificationError, match="not in this key history"):
        verify_key_history(history, Ed25519PrivateKey.generate().public_key())


def test_a_record_endorsed_by_its_own_key_is_refused() -> None:
    """A forged history entry: the attacker appends their key and signs the endorsement
    with it (they do not hold the previous key)."""
    keys, history = chain(2)
    attacker = Ed25519PrivateKey.generate()
    # extend_history refuses an endorser that is not the history's last key: by hand.
    fake = extend_history(genesis_history(attacker, T0), attacker, attacker, T2)["keys"][1]
    fake["seq"] = 2
    fake["prev_sha256"] = record_sha256(history["keys"][1])
    tampered = {**history, "keys": [*history["keys"], fake]}
    with pytest.raises(VerificationError):
        verify_key_history(tampered, keys[0].public_key())


def test_a_key_endorsed_by_nobody_is_refused() -> None:
    keys, history = chain(2)
    tampered = copy.deepcopy(history)
    tampered["keys"][1]["endorsement"] = None
    with pytest.raises(VerificationError, match="endorsed by nobody"):
        verify_key_history(tampered, keys[0].public_key())


def test_an_endorsement_by_the_wrong_key_is_refused() -> None:
    keys, history = chain(3)
    tampered = copy.deepcopy(history)
    tampered["keys"][2]["endorsement"] = tampered["keys"][1]["endorsement"]
    with pytest.raises(VerificationError, match="endorsement does not verify"):
        verify_key_history(tampered, keys[0].public_key())


@pytest.mark.parametrize(
    "edit",
    [
        lambda h: h["keys"].pop(1),  # a key dropped from the middle
        lambda h: h["keys"].reverse(),  # reordered
        lambda h: h["keys"][1].update(created_at=T2),  # an edited field
        lambda h: h["keys"][0].update(created_at=T1),  # an edited earlier record
        lambda h: h.update(keys=h["keys"] + [copy.deepcopy(h["keys"][1])]),  # a key twice
    ],
)
def test_an_edited_history_is_refused_whole(edit: Any) -> None:
    keys, history = chain(3)
    tampered = copy.deepcopy(history)
    edit(tampered)
    with pytest.raises(VerificationError):
        verify_key_history(tampered, keys[0].public_key())


def test_another_deployments_history_does_not_name_our_key() -> None:
    """A history file swapped in from another deployment (or copied folder) is refused."""
    ours, _ = chain(2)
    _, theirs = chain(2)
    with pytest.raises(VerificationError, match="not in this key history"):
        verify_key_history(theirs, ours[0].public_key())


def test_a_checkpoint_verifies_with_the_key_set_of_a_history() -> None:
    keys, history = chain(3)
    note = sign_checkpoint(keys[2], "uprof.test/audit", 3, bytes(32))
    with pytest.raises(VerificationError):
        verify_checkpoint(note, keys[0].public_key(), "uprof.test/audit")
    accepted = trusted_keys(keys[0].public_key(), history)
    assert verify_checkpoint(note, accepted, "uprof.test/audit").tree_size == 3
    stranger = sign_checkpoint(Ed25519PrivateKey.generate(), "uprof.test/audit", 3, bytes(32))
    with pytest.raises(VerificationError, match="no signature by the pinned key"):
        verify_checkpoint(stranger, accepted, "uprof.test/audit")


# --- the key folder ---------------------------------------------------------------------------


def test_a_ring_rotates_and_every_key_stays_endorsed(tmp_path: Path) -> None:
    ring = FileKeyRing(tmp_path)
    first = ring.current()
    assert ring.history().key_ids == (key_id(first),)
    done = ring.rotate()
    assert done.previous_key_id == key_id(first)
    assert key_id(ring.current()) == done.key_id != key_id(first)
    again = FileKeyRing(tmp_path)  # another process
    assert key_id(again.current()) == done.key_id
    document = json.loads((tmp_path / HISTORY_FILE).read_text())
    verified = verify_key_history(document, first.public_key())
    assert verified.key_ids == (key_id(first), done.key_id)
    assert not (tmp_path / NEXT_KEY_FILE).exists()
    assert oct((tmp_path / KEY_FILE).stat().st_mode & 0o777) == "0o600"


def test_another_process_sees_a_rotation_at_its_next_signature(tmp_path: Path) -> None:
    server, operator = FileKeyRing(tmp_path), FileKeyRing(tmp_path)
    before = key_id(server.current())
    operator.rotate()
    assert key_id(server.current()) != before
    assert key_id(server.current()) == key_id(operator.current())
    assert len(server.trusted()) == 2


def test_a_rotation_killed_after_its_history_write_is_finished_at_the_next_open(
    tmp_path: Path,
) -> None:
    ring = FileKeyRing(tmp_path)
    old = ring.current()
    new = Ed25519PrivateKey.generate()
    document = json.loads((tmp_path / HISTORY_FILE).read_text())
    (tmp_path / NEXT_KEY_FILE).write_bytes(_pem(new))
    os.chmod(tmp_path / NEXT_KEY_FILE, 0o600)
    later = "2099-01-01T00:00:00.000000Z"
    (tmp_path / HISTORY_FILE).write_text(json.dumps(extend_history(document, old, new, later)))
    reopened = FileKeyRing(tmp_path)
    assert key_id(reopened.current()) == key_id(new)
    assert not (tmp_path / NEXT_KEY_FILE).exists()


def test_a_rotation_killed_before_its_history_write_leaves_the_old_key(tmp_path: Path) -> None:
    old = FileKeyRing(tmp_path).current()
    (tmp_path / NEXT_KEY_FILE).write_bytes(_pem(Ed25519PrivateKey.generate()))
    os.chmod(tmp_path / NEXT_KEY_FILE, 0o600)
    reopened = FileKeyRing(tmp_path)
    assert key_id(reopened.current()) == key_id(old)
    assert reopened.history().key_ids == (key_id(old),)
    assert not (tmp_path / NEXT_KEY_FILE).exists()


def test_a_key_file_replaced_by_hand_is_refused(tmp_path: Path) -> None:
    FileKeyRing(tmp_path).current()
    (tmp_path / KEY_FILE).unlink()
    (tmp_path / KEY_FILE).write_bytes(_pem(Ed25519PrivateKey.generate()))
    os.chmod(tmp_path / KEY_FILE, 0o600)
    with pytest.raises(AuditKeyError, match="names key"):
        FileKeyRing(tmp_path).current()


def test_a_history_file_swapped_in_is_refused(tmp_path: Path) -> None:
    FileKeyRing(tmp_path).current()
    _, theirs = chain(2)
    (tmp_path / HISTORY_FILE).write_text(json.dumps(theirs))
    with pytest.raises(AuditKeyError):
        FileKeyRing(tmp_path).current()


def test_a_legacy_key_folder_gets_a_history_of_its_key(tmp_path: Path) -> None:
    """A key folder from before rotation existed: the pinned key becomes the first key."""
    legacy = Ed25519PrivateKey.generate()
    (tmp_path / KEY_FILE).write_bytes(_pem(legacy))
    os.chmod(tmp_path / KEY_FILE, 0o600)
    ring = FileKeyRing(tmp_path)
    assert ring.history().key_ids == (key_id(legacy),)
    assert key_id(load_signing_key(tmp_path / KEY_FILE)) == key_id(legacy)


def _pem(key: Ed25519PrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def test_temporary_files_a_killed_rotation_left_are_removed_at_the_next_open(
    tmp_path: Path,
) -> None:
    """A rotation killed inside a write leaves its temporary file: for the next key, a
    private key nobody will use, which must not stay in the key folder."""
    FileKeyRing(tmp_path).current()
    left = [
        tmp_path / f".{NEXT_KEY_FILE}.123.abcd.tmp",
        tmp_path / f".{HISTORY_FILE}.123.abcd.tmp",
    ]
    for path in left:
        path.write_bytes(_pem(Ed25519PrivateKey.generate()))
    FileKeyRing(tmp_path).current()
    assert [p for p in left if p.exists()] == []
