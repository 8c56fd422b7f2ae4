"""Review of decision 0110 (audit key rotation), the key history's verifiers: attacks and
edge cases that the history's own tests did not cover (docs/decisions, review of 0110)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.checkpoint import sign_checkpoint, verify_checkpoint
from audit.errors import AuditKeyError, VerificationError
from audit.keyring import (
    HISTORY_FILE,
    KEY_FILE,
    FileKeyRing,
    extend_history,
    genesis_history,
    verify_key_history,
)
from audit.keys import note_key_id

ORIGIN = "uprof.local/audit"
T0 = "2026-12-05T10:00:00.000000Z"
T1 = "2026-12-05T11:00:00.000000Z"

#: Two Ed25519 seeds whose C2SP note key ids (4 bytes) for ORIGIN collide: found by
#: generating 51,447 keys (a birthday search, 4 s). Among the keys of one history such a
#: pair turns up by chance with probability n^2 / 2^33 (about 2e-3 at 4,096 keys).
COLLIDING = (
    bytes.fromhex("30f8a6a04081dac2e86e6922ebe20c86b8447621ebdea0f671a751eeb900991b"),
    bytes.fromhex("4bfa0dc2cd74f72785c4aad7ca95e09f034e5d6246a261a3da546ba53165f47b"),
)


def test_two_keys_of_one_history_with_the_same_note_key_id_both_verify_checkpoints() -> None:
    """A checkpoint line names its key by 4 bytes only. With two keys of the history
    sharing them, the verifier kept one key per id and refused the other key's valid
    checkpoints ("does not verify"): every checkpoint, receipt and export of one key
    refused, for keys the history endorses."""
    first, second = (Ed25519PrivateKey.from_private_bytes(seed) for seed in COLLIDING)
    assert note_key_id(ORIGIN, first.public_key()) == note_key_id(ORIGIN, second.public_key())
    history = extend_history(genesis_history(first, T0), first, second, T1)
    keys = verify_key_history(history, first.public_key()).keys
    root = bytes(32)
    for signer in (first, second):
        note = sign_checkpoint(signer, ORIGIN, 7, root)
        assert verify_checkpoint(note, keys, ORIGIN) == (7, root)
    # Still: a line with that id that neither key signed is refused, not skipped.
    forged = sign_checkpoint(first, ORIGIN, 8, root)
    with pytest.raises(VerificationError, match="does not verify"):
        verify_checkpoint(forged.replace("\n8\n", "\n9\n"), keys, ORIGIN)


def _folder_with_history(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    folder = tmp_path / "keys"
    ring = FileKeyRing(folder)
    ring.rotate()
    ring.rotate()
    return folder, json.loads((folder / HISTORY_FILE).read_text())


BAD_VALUES: list[Any] = [None, 0, 1, -1, True, "", "x", [], {}, [1], {"a": 1}, "0" * 64]


def _malformed(good: dict[str, Any]) -> list[bytes]:
    cases = [b"", b"{", b"[]", b"null", b'"x"', b"\xff\xfe", b'{"format": 1}']
    for value in BAD_VALUES:
        for where in ("keys", "format"):
            doc = copy.deepcopy(good)
            doc[where] = value
            cases.append(json.dumps(doc).encode())
        for i in range(len(good["keys"])):
            doc = copy.deepcopy(good)
            doc["keys"][i] = value
            cases.append(json.dumps(doc).encode())
            for field in sorted(good["keys"][i]):
                doc = copy.deepcopy(good)
                if doc["keys"][i][field] == value:
                    continue
                doc["keys"][i][field] = value
                cases.append(json.dumps(doc).encode())
    return cases


def test_a_malformed_history_file_stops_the_ring_naming_the_file(tmp_path: Path) -> None:
    """Held: every malformed audit-keys.json (bad JSON, wrong types, missing or altered
    fields) is refused with an AuditKeyError naming the file; none is accepted, none
    escapes as another exception."""
    folder, good = _folder_with_history(tmp_path)
    for number, raw in enumerate(_malformed(good)):
        copy_dir = tmp_path / f"copy-{number}"
        shutil.copytree(folder, copy_dir)
        (copy_dir / HISTORY_FILE).write_bytes(raw)
        with pytest.raises(AuditKeyError, match=HISTORY_FILE):
            FileKeyRing(copy_dir).history()


def test_a_key_file_swapped_under_a_running_ring_is_not_signed_with(tmp_path: Path) -> None:
    """The ring re-reads the key file when its inode changes (a rotation by another
    process). A key file the history does not name last (a copy put back by hand while
    the server runs) was loaded and signed with: checkpoints nobody's history verifies.
    Now the ring refuses to hand out that key, as the next start would."""
    folder, _ = _folder_with_history(tmp_path)
    ring = FileKeyRing(folder)
    ring.current()
    stranger = tmp_path / "stranger"
    FileKeyRing(stranger).current()
    shutil.copy2(stranger / KEY_FILE, folder / ".swap")
    (folder / ".swap").replace(folder / KEY_FILE)
    with pytest.raises(AuditKeyError, match="replaced by hand"):
        ring.current()


def _chain(n: int) -> tuple[list[Ed25519PrivateKey], dict[str, Any]]:
    keys = [Ed25519PrivateKey.generate() for _ in range(n)]
    history = genesis_history(keys[0], T0)
    for i in range(1, n):
        history = extend_history(history, keys[i - 1], keys[i], T1)
    return keys, history


def test_a_key_endorsed_again_later_is_refused() -> None:
    """Held: a key coming back (K0, K1, K0 again), every signature genuine, is refused:
    a key id names one position of the history."""
    keys, history = _chain(2)
    again = extend_history(history, keys[1], keys[0], T1)
    with pytest.raises(VerificationError, match="appears twice"):
        verify_key_history(again, keys[0].public_key())


def test_records_of_two_deployments_spliced_are_refused() -> None:
    """Held: the first records of one deployment followed by a later record of another
    (each record intact, its signatures genuine) break the hash chain or the
    endorsement."""
    ours_keys, ours = _chain(2)
    _, theirs = _chain(3)
    spliced = copy.deepcopy(ours)
    spliced["keys"].append(copy.deepcopy(theirs["keys"][2]))
    with pytest.raises(VerificationError, match="prev_sha256"):
        verify_key_history(spliced, ours_keys[0].public_key())


def test_a_later_trusted_key_vouches_for_no_key_put_before_it() -> None:
    """Held: a verifier that trusts a later key (K1) is given a history with a stranger's
    key put in front (positions shifted, or in K0's place): K1's acceptance covers the
    record before it, so neither verifies."""
    keys, history = _chain(3)
    stranger = Ed25519PrivateKey.generate()
    prefixed = genesis_history(stranger, T0)
    prefixed["keys"] += [copy.deepcopy(record) for record in history["keys"]]
    for seq, record in enumerate(prefixed["keys"]):
        record["seq"] = seq
    with pytest.raises(VerificationError):
        verify_key_history(prefixed, keys[1].public_key())
    replaced = copy.deepcopy(history)
    replaced["keys"][0] = genesis_history(stranger, T0)["keys"][0]
    with pytest.raises(VerificationError):
        verify_key_history(replaced, keys[1].public_key())


def test_a_folder_put_together_from_two_copies_does_not_open(tmp_path: Path) -> None:
    """Held: the newer history with an older key file of the same deployment (a key
    endorsed by the history, but not its last), and the older history with the newer key
    file, each stop the ring at opening, naming both files."""
    folder = tmp_path / "keys"
    FileKeyRing(folder).current()
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    FileKeyRing(folder).rotate()
    new_history_old_key = tmp_path / "a"
    shutil.copytree(folder, new_history_old_key)
    shutil.copy2(old / KEY_FILE, new_history_old_key / KEY_FILE)
    old_history_new_key = tmp_path / "b"
    shutil.copytree(old, old_history_new_key)
    shutil.copy2(folder / KEY_FILE, old_history_new_key / KEY_FILE)
    for mixed in (new_history_old_key, old_history_new_key):
        with pytest.raises(AuditKeyError, match=f"{HISTORY_FILE}.*{KEY_FILE}"):
            FileKeyRing(mixed).current()


def test_a_rotation_past_the_history_limit_is_refused_before_it_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Verifiers refuse a history longer than MAX_KEYS. A rotation past it wrote the
    history anyway (its commit point), after which the key folder no longer opened: no
    start, no signature, and the previous key's private half already gone. The rotation
    now refuses first and leaves the folder as it was."""
    import audit.keyring as keyring

    monkeypatch.setattr(keyring, "MAX_KEYS", 3)
    folder = tmp_path / "keys"
    ring = FileKeyRing(folder)
    ring.rotate()
    ring.rotate()
    before = (folder / HISTORY_FILE).read_bytes(), (folder / KEY_FILE).read_bytes()
    with pytest.raises(AuditKeyError, match="3 keys"):
        ring.rotate()
    assert ((folder / HISTORY_FILE).read_bytes(), (folder / KEY_FILE).read_bytes()) == before
    assert len(FileKeyRing(folder).history().keys) == 3
