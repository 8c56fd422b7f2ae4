"""Signing keys, key ids and C2SP signed-note checkpoints."""

from __future__ import annotations

import base64
import os
import stat
import threading
from hashlib import sha256
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from audit.checkpoint import EM_DASH, sign_checkpoint, verify_checkpoint
from audit.errors import AuditKeyError, VerificationError
from audit.keys import (
    key_id,
    load_or_create_signing_key,
    load_public_key,
    note_key_id,
    public_key_pem,
    raw_public_key,
)
from domain.errors import InvalidInputError, UprofError

ORIGIN = "uprof.test/audit"
ROOT = sha256(b"some root").digest()

# The example key and note of golang.org/x/mod/sumdb/note (Go's reference implementation).
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_SKEY_B64 = "AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
GO_SIG = (
    "x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM="
)


def test_note_key_id_and_signature_match_go_reference_vector() -> None:
    name, hash_hex, key_b64 = GO_VKEY.split("+", 2)
    public = base64.b64decode(key_b64)
    assert public[0] == 1  # Ed25519
    public_key = Ed25519PublicKey.from_public_bytes(public[1:])
    assert note_key_id(name, public_key).hex() == hash_hex
    private = Ed25519PrivateKey.from_private_bytes(base64.b64decode(GO_SKEY_B64)[1:])
    blob = note_key_id(name, private) + private.sign(GO_TEXT.encode())
    assert base64.b64encode(blob).decode() == GO_SIG


def test_key_file_is_created_with_mode_0600_and_reloads(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "audit.pem"
    key = load_or_create_signing_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    again = load_or_create_signing_key(path)
    assert raw_public_key(again) == raw_public_key(key)
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_concurrent_creation_yields_one_key(tmp_path: Path) -> None:
    path = tmp_path / "audit.pem"
    results: list[bytes] = []
    barrier = threading.Barrier(8)

    def create() -> None:
        barrier.wait()
        results.append(raw_public_key(load_or_create_signing_key(path)))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1
    assert raw_public_key(load_or_create_signing_key(path)) == results[0]


def test_key_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "audit.pem"
    load_or_create_signing_key(path)
    os.chmod(path, 0o644)
    with pytest.raises(AuditKeyError, match="chmod 600") as caught:
        load_or_create_signing_key(path)
    assert isinstance(caught.value, UprofError)


def test_malformed_or_foreign_key_files_are_refused(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_bytes(b"not a key")
    garbage.chmod(0o600)
    with pytest.raises(AuditKeyError, match="not a PEM private key"):
        load_or_create_signing_key(garbage)
    ec = tmp_path / "ec.pem"
    ec.write_bytes(
        generate_private_key(SECP256R1()).private_bytes(
            Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
        )
    )
    ec.chmod(0o600)
    with pytest.raises(AuditKeyError, match="not Ed25519"):
        load_or_create_signing_key(ec)


def test_public_key_export_and_ids() -> None:
    key = Ed25519PrivateKey.generate()
    pem = public_key_pem(key)
    assert pem.startswith(b"-----BEGIN PUBLIC KEY-----")
    loaded = load_public_key(pem)
    assert raw_public_key(loaded) == raw_public_key(key)
    assert raw_public_key(load_public_key(raw_public_key(key))) == raw_public_key(key)
    assert key_id(key) == sha256(raw_public_key(key)).hexdigest()
    expected = sha256(ORIGIN.encode() + b"\n\x01" + raw_public_key(key)).digest()[:4]
    assert note_key_id(ORIGIN, key) == expected


# --- Checkpoints ------------------------------------------------------------------------------


def test_checkpoint_has_the_c2sp_layout_and_verifies() -> None:
    key = Ed25519PrivateKey.generate()
    note = sign_checkpoint(key, ORIGIN, 42, ROOT)
    body, signature_line = note.split("\n\n")
    assert body == f"{ORIGIN}\n42\n{base64.b64encode(ROOT).decode()}"
    assert signature_line.startswith(f"{EM_DASH} {ORIGIN} ")
    blob = base64.b64decode(signature_line.split(" ")[2])
    assert blob[:4] == note_key_id(ORIGIN, key)
    key.public_key().verify(blob[4:], (body + "\n").encode())
    assert verify_checkpoint(note, key.public_key(), ORIGIN) == (42, ROOT)


def test_checkpoint_rejects_wrong_key_or_origin() -> None:
    key = Ed25519PrivateKey.generate()
    note = sign_checkpoint(key, ORIGIN, 7, ROOT)
    with pytest.raises(VerificationError, match="no signature by the pinned key"):
        verify_checkpoint(note, Ed25519PrivateKey.generate().public_key(), ORIGIN)
    with pytest.raises(VerificationError, match="origin"):
        verify_checkpoint(note, key.public_key(), "other.origin/log")


def test_unknown_signatures_are_skipped_but_one_known_is_required() -> None:
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    note = sign_checkpoint(key, ORIGIN, 7, ROOT)
    foreign_line = sign_checkpoint(other, "witness.example", 7, ROOT).split("\n\n")[1]
    cosigned = note + foreign_line
    assert verify_checkpoint(cosigned, key.public_key(), ORIGIN) == (7, ROOT)
    only_foreign = note.split("\n\n")[0] + "\n\n" + foreign_line
    with pytest.raises(VerificationError):
        verify_checkpoint(only_foreign, key.public_key(), ORIGIN)


def test_every_single_character_change_in_a_checkpoint_fails() -> None:
    key = Ed25519PrivateKey.generate()
    note = sign_checkpoint(key, ORIGIN, 123456, ROOT)
    replacements = "A0a+/=\n —x"
    for position in range(len(note)):
        for replacement in replacements:
            if note[position] == replacement:
                continue
            mutated = note[:position] + replacement + note[position + 1 :]
            with pytest.raises(VerificationError):
                verify_checkpoint(mutated, key.public_key(), ORIGIN)
        with pytest.raises(VerificationError):
            verify_checkpoint(note[:position] + note[position + 1 :], key.public_key(), ORIGIN)


@pytest.mark.parametrize(
    "broken",
    [
        "",
        "uprof.test/audit\n5\n",
        "uprof.test/audit\n05\n{root}\n\n{sig}",
        "uprof.test/audit\n5\n{root}\n{sig}",
        "uprof.test/audit\n5\n{root}\n\n",
        "uprof.test/audit\n5\n{root}\r\n\n{sig}",
    ],
)
def test_malformed_notes_are_rejected(broken: str) -> None:
    key = Ed25519PrivateKey.generate()
    good = sign_checkpoint(key, ORIGIN, 5, ROOT)
    sig = good.split("\n\n")[1]
    note = broken.format(root=base64.b64encode(ROOT).decode(), sig=sig)
    with pytest.raises(VerificationError):
        verify_checkpoint(note, key.public_key(), ORIGIN)


def test_bad_origins_are_refused_when_signing() -> None:
    key = Ed25519PrivateKey.generate()
    for origin in ("", "has space", "{json", "a\nb", "x" * 300):
        with pytest.raises(InvalidInputError):
            sign_checkpoint(key, origin, 1, ROOT)
