"""Review of decision 0175-retired-below, as an outside attacker: two rotations, notes
co-signed by a retired key and another, and key histories cut or reordered. The attacks
the code withstood, kept (both backends for the real log; forks are SQLite files)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.checkpoint import sign_checkpoint, verify_checkpoint
from audit.errors import VerificationError
from audit.keyring import RETIRED_AT, FileKeyRing, StaticSigningKeys, trusted_keys
from audit.keys import key_id, load_signing_key
from audit.log import AuditLog
from audit.tables import create_tables
from tests.audit.conftest import ORIGIN, audit_log_on
from tests.audit.test_log import fill
from uprof.backends import backend_for


def _b64(hashes: list[bytes]) -> list[str]:
    return [base64.b64encode(h).decode() for h in hashes]


def _cosign(note: str, key: Ed25519PrivateKey) -> str:
    """``note`` with one more signature line, by ``key``, over the same body."""
    origin, size, root = note[: note.index("\n\n")].split("\n")
    return note + sign_checkpoint(key, origin, int(size), base64.b64decode(root)).split("\n\n")[1]


def _twice_rotated(
    engine: sa.Engine, folder: Path
) -> tuple[AuditLog, FileKeyRing, list[tuple[Ed25519PrivateKey, str]]]:
    """A log whose key was rotated out at 5 (K1) and at 9 (K2); K3 is current. Return
    each retired key with a note it signed below its point (K1 at 3, K2 at 7)."""
    ring = FileKeyRing(folder)
    log = audit_log_on(engine, ring)
    retired = []
    for below, point in ((3, 5), (7, 9)):
        fill(log, below - log.size())
        note = log.checkpoint()
        fill(log, point - log.size())
        log.checkpoint()
        retired.append((load_signing_key(ring.key_path), note))
        ring.rotate(log_head=log.held_head)
    fill(log, 4)
    return log, ring, retired


def test_two_rotations_each_key_proven_to_its_own_point_only(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """Held. K1 (point 5) and K2 (point 9): a note of each below its point verifies only
    with the log's proof to that key's point, not to the other key's, not from another
    size, and not without; the history's points are where each rotation happened."""
    log, _, ((k1, n1), (k2, n2)) = _twice_rotated(engine, tmp_path / "keys")
    keys = log.trusted_keys()
    assert [keys.retired_at[key_id(k)].tree_size for k in (k1, k2)] == [5, 9]
    for note, size, own, other in ((n1, 3, 5, 9), (n2, 7, 9, 5)):
        with pytest.raises(VerificationError, match="rotation proof"):
            verify_checkpoint(note, keys, ORIGIN)
        verify_checkpoint(note, keys, ORIGIN, rotation_proof=_b64(log.consistency_proof(size, own)))
        wrong = [_b64(log.consistency_proof(size - 1, own))]
        if other > size:
            wrong.append(_b64(log.consistency_proof(size, other)))
        for proof in wrong:
            with pytest.raises(VerificationError, match="a retired key's fork"):
                verify_checkpoint(note, keys, ORIGIN, rotation_proof=proof)


def test_a_leaked_middle_key_forks_between_the_rotations_and_is_refused(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """Held. Whoever holds K2 (current from 5 to 9) signs a fork of size 7 that copies the
    real log's first 6 entries: with the real log's proof 7 -> 9, refused; co-signed by
    K1 too (both leaked), K1's range refuses it (7 > 5); a stranger's co-signature is
    skipped and does not stand in for the current key."""
    log, _, ((k1, _), (k2, _)) = _twice_rotated(engine, tmp_path / "keys")
    keys = log.trusted_keys()
    fork = sa.create_engine(f"sqlite:///{tmp_path / 'fork.sqlite'}")
    create_tables(fork, backend_for(fork))
    forger = audit_log_on(fork, StaticSigningKeys(k2))
    forger.append_many(json.loads(e.entry_json) for e in log.entries(tree_size=6))
    forger.append({"action": "consent.granted", "subject_ref": "sub_forged"})
    note = forger.checkpoint()
    real = _b64(log.consistency_proof(7, 9))
    with pytest.raises(VerificationError, match="a retired key's fork"):
        verify_checkpoint(note, keys, ORIGIN, rotation_proof=real)
    with pytest.raises(VerificationError, match="rotated out at tree size 5"):
        verify_checkpoint(_cosign(note, k1), keys, ORIGIN, rotation_proof=real)
    stranger = _cosign(note, Ed25519PrivateKey.generate())
    with pytest.raises(VerificationError, match="rotation proof"):
        verify_checkpoint(stranger, keys, ORIGIN)
    fork.dispose()


def test_a_note_the_current_key_cosigns_needs_no_proof_and_a_retired_one_adds_nothing(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """Held. A real note below K1's point co-signed by the current key K3 verifies
    without a proof (K3's word is enough), K1's line still checked: a K1 line that does
    not verify refuses the note, and a fork's note co-signed by K1 and K3 can only be
    made by whoever holds K3 (the current key, not an attacker's)."""
    log, ring, ((_, n1), _) = _twice_rotated(engine, tmp_path / "keys")
    keys = log.trusted_keys()
    current = load_signing_key(ring.key_path)
    verify_checkpoint(_cosign(n1, current), keys, ORIGIN)
    body, sigs = n1.split("\n\n")
    bad = body + "\n\n" + sigs[:-6] + ("A" if sigs[-6] != "A" else "B") + sigs[-5:]
    with pytest.raises(VerificationError, match="does not verify"):
        verify_checkpoint(_cosign(bad, current), keys, ORIGIN)


def test_a_history_cut_before_the_second_rotation_or_reordered_is_refused(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """Held. The history handed in beside a forgery of K2 (rotated out at 9): its last
    record cut off (K2 would be current, unbounded) does not name the pinned current key;
    its records reordered, or the second rotation's point removed (a v1 record: K2
    unbounded), break the chain's signatures."""
    _, ring, _ = _twice_rotated(engine, tmp_path / "keys")
    pinned = load_signing_key(ring.key_path).public_key()
    history = json.loads(ring.history_path.read_text())
    trusted_keys(pinned, history)  # the real one
    cut = {**history, "keys": history["keys"][:2]}
    reordered = {**history, "keys": [history["keys"][0], history["keys"][2], history["keys"][1]]}
    stripped_record = {k: v for k, v in history["keys"][2].items() if k != RETIRED_AT}
    stripped = {**history, "keys": [*history["keys"][:2], stripped_record]}
    assert RETIRED_AT in history["keys"][2]
    for forged in (cut, reordered, stripped):
        with pytest.raises(VerificationError):
            trusted_keys(pinned, forged)
