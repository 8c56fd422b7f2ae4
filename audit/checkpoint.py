"""Signed checkpoints in the C2SP signed-note format (tlog-checkpoint + signed-note).

A checkpoint note::

    <origin>\\n
    <tree size, decimal>\\n
    <base64 root hash>\\n
    \\n
    — <key name> <base64(note key id (4 bytes) || Ed25519 signature (64 bytes))>\\n

The signature covers the body (the first three lines, final newline included, without the
blank separator line). The key name is the origin. Verification needs only the pinned public
key and the expected origin: signature lines from unknown keys are skipped, and a note that no
pinned key verifies is rejected (C2SP signed-note.md; FIELD-NOTES §5.2).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from audit._codec import b64decode_strict, b64encode
from audit.errors import VerificationError
from audit.keys import RotationProof, TrustedKeys, note_key_id
from audit.merkle import HASH_SIZE
from domain.errors import InvalidInputError

EM_DASH = "\u2014"
#: C2SP signed-note: verifiers must reject notes with more than 100 signatures.
MAX_SIGNATURES = 100
#: Origins are schema-less URL-like names ("uprof.example/audit"); no whitespace, no "{" or
#: control characters, which also keeps checkpoint messages apart from the JSON and export
#: messages the same key signs.
_ORIGIN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/:]{0,254}\Z")
_SIZE_RE = re.compile(r"^(0|[1-9][0-9]{0,18})\Z")
_MAX_TREE_SIZE = 2**63 - 1


class CheckpointBody(NamedTuple):
    """What a verified checkpoint commits to."""

    tree_size: int
    root: bytes


def check_origin(origin: str) -> str:
    """Return ``origin`` if it is a valid log origin; raise InvalidInputError otherwise."""
    if not isinstance(origin, str) or not _ORIGIN_RE.match(origin):
        raise InvalidInputError(
            f"log origin {origin!r} must be 1-255 characters of letters, digits and ._-/: "
            "starting with a letter or digit (e.g. 'uprof.example.org/audit')"
        )
    return origin


def checkpoint_body(origin: str, tree_size: int, root: bytes) -> str:
    """Return the signed text of a checkpoint (with its final newline)."""
    check_origin(origin)
    if not 0 <= tree_size <= _MAX_TREE_SIZE:
        raise InvalidInputError(f"tree size {tree_size} is out of range")
    if len(root) != HASH_SIZE:
        raise InvalidInputError(f"root must be {HASH_SIZE} bytes, got {len(root)}")
    return f"{origin}\n{tree_size}\n{b64encode(root)}\n"


def sign_checkpoint(key: Ed25519PrivateKey, origin: str, tree_size: int, root: bytes) -> str:
    """Return a C2SP signed note for ``(origin, tree_size, root)`` signed by ``key``."""
    body = checkpoint_body(origin, tree_size, root)
    signature = key.sign(body.encode("utf-8"))
    blob = note_key_id(origin, key) + signature
    return f"{body}\n{EM_DASH} {origin} {b64encode(blob)}\n"


def verify_checkpoint(
    note: str,
    public_key: Ed25519PublicKey | Sequence[Ed25519PublicKey],
    origin: str,
    *,
    rotation_proof: RotationProof = None,
) -> CheckpointBody:
    """Verify a checkpoint note with the pinned key and origin; return (tree_size, root).

    ``public_key`` may be several keys (an endorsed key history, ``audit.keyring``): a
    signature line by any of them must verify, and at least one must be present. Given as
    ``TrustedKeys`` (the history's ranges), a retired key's checkpoint above its point is
    refused, and one below it (size m < N) verifies only with ``rotation_proof``, the
    log's consistency proof from m to N (``TrustedKeys.check_reaches_point``); pass
    ``audit.keys.HELD_BY_READER`` for a note the reader chose to trust, not one handed in.

    Raises VerificationError on any malformation, a wrong origin, or a missing or bad signature.
    """
    if isinstance(note, bytes):
        try:
            note = note.decode("utf-8")
        except UnicodeDecodeError:
            raise VerificationError("checkpoint note is not UTF-8") from None
    if not isinstance(note, str):
        raise VerificationError("checkpoint note is not text")
    if any((c < " " and c != "\n") or c == "\x7f" for c in note):
        raise VerificationError("checkpoint note contains control characters")
    if not note.endswith("\n"):
        raise VerificationError("checkpoint note does not end with a newline")
    separator = note.find("\n\n")
    if separator < 0:
        raise VerificationError("checkpoint note has no blank line before its signatures")
    body, signature_block = note[: separator + 1], note[separator + 2 :]
    tree_size, root = _parse_body(body, origin)
    signers = _verify_signatures(body, signature_block, public_key, origin)
    if isinstance(public_key, TrustedKeys):
        # The one place key ranges are applied: every verifier comes through here.
        for key in signers:
            public_key.check_signed_range(key, tree_size, root)
        public_key.check_reaches_point(signers, tree_size, root, rotation_proof)
    return CheckpointBody(tree_size, root)


def _parse_body(body: str, origin: str) -> tuple[int, bytes]:
    lines = body[:-1].split("\n")
    if len(lines) < 3:
        raise VerificationError("checkpoint body needs origin, tree size and root lines")
    if lines[0] != origin:
        raise VerificationError(f"checkpoint origin {lines[0]!r} is not the expected {origin!r}")
    if not _SIZE_RE.match(lines[1]) or int(lines[1]) > _MAX_TREE_SIZE:
        raise VerificationError(f"checkpoint tree size {lines[1]!r} is not a decimal integer")
    root = b64decode_strict(lines[2], "checkpoint root", size=HASH_SIZE)
    return int(lines[1]), root


def _verify_signatures(
    body: str,
    signature_block: str,
    public_key: Ed25519PublicKey | Sequence[Ed25519PublicKey],
    origin: str,
) -> list[Ed25519PublicKey]:
    """Check every signature line by a trusted key; return the keys that signed."""
    if not signature_block:
        raise VerificationError("checkpoint note has no signature lines")
    lines = signature_block[:-1].split("\n")
    if len(lines) > MAX_SIGNATURES:
        raise VerificationError(f"checkpoint note has more than {MAX_SIGNATURES} signatures")
    keys = [public_key] if isinstance(public_key, Ed25519PublicKey) else list(public_key)
    # A note key id is 4 bytes: two keys of a long history may share one (the birthday
    # bound, n^2 / 2^33), so an id names a list of candidate keys, and a line is good when
    # one of them verifies it (C2SP signed-note: key ids are not unique).
    by_id: dict[bytes, list[Ed25519PublicKey]] = {}
    for candidate in keys:
        by_id.setdefault(note_key_id(origin, candidate), []).append(candidate)
    signed_by: list[Ed25519PublicKey] = []
    for line in lines:
        parts = line.split(" ")
        if len(parts) != 3 or parts[0] != EM_DASH or not parts[1]:
            raise VerificationError(f"malformed checkpoint signature line {line!r}")
        name, blob_text = parts[1], parts[2]
        blob = b64decode_strict(blob_text, "checkpoint signature")
        if len(blob) < 5:
            raise VerificationError("checkpoint signature is too short")
        candidates = by_id.get(blob[:4], []) if name == origin else []
        if not candidates:
            continue  # C2SP: signatures from unknown keys are skipped
        if len(blob) != 4 + 64:
            raise VerificationError("checkpoint Ed25519 signature has the wrong length")
        good = [key for key in candidates if _verifies(key, blob[4:], body)]
        if not good:
            raise VerificationError("checkpoint signature by the pinned key does not verify")
        signed_by.extend(good)
    if not signed_by:
        raise VerificationError(
            f"checkpoint carries no signature by the pinned key for origin {origin!r}"
        )
    return signed_by


def _verifies(key: Ed25519PublicKey, signature: bytes, body: str) -> bool:
    try:
        key.verify(signature, body.encode("utf-8"))
    except InvalidSignature:
        return False
    return True
