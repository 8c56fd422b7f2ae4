"""Ed25519 signing keys for the audit log: load-or-create, export and key ids.

Two key ids exist, for two audiences:

- ``key_id(public_key)``: hex SHA-256 of the raw 32-byte public key. Receipts and export
  headers carry it so a verifier can tell which pinned key to use (FIELD-NOTES §5.4).
- ``note_key_id(name, public_key)``: the 4-byte C2SP signed-note key id,
  ``SHA-256(name || 0x0A || 0x01 || public_key)[:4]`` (0x01 = Ed25519 signature type),
  carried in checkpoint signature lines.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from hashlib import sha256
from pathlib import Path
from typing import NamedTuple, TypeAlias

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from audit._codec import b64decode_strict
from audit.errors import AuditKeyError, VerificationError
from audit.lockfile import read_key_file
from audit.merkle import HASH_SIZE, verify_consistency

#: C2SP signed-note signature type byte for Ed25519.
ED25519_NOTE_ALGORITHM = b"\x01"


def load_or_create_signing_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """Load the Ed25519 key at ``path``, or create it there (PEM PKCS#8, mode 0600).

    A new key is written to a private temporary file and hard-linked into place, so the key
    file appears complete or not at all, and two processes starting together end up with the
    same key. A key file readable or writable by group or others is refused, like ssh does.
    """
    key_path = Path(path)
    if key_path.exists():
        return load_signing_key(key_path)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    key_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp_path = key_path.with_name(f".{key_path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(pem)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(tmp_path, key_path)
        except FileExistsError:
            return load_signing_key(key_path)  # another process won the race
    finally:
        tmp_path.unlink(missing_ok=True)
    return key


def load_signing_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """Load an existing Ed25519 private key (PEM) that only its owner can read."""
    key_path = Path(path)
    try:
        # Checked as every key file (bug PR): no link, this user's, mode 0600.
        pem = read_key_file(key_path)
    except FileNotFoundError:
        raise AuditKeyError(f"signing key file {key_path} does not exist") from None
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise AuditKeyError(
            f"signing key file {key_path} is not a PEM private key: {exc}"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise AuditKeyError(
            f"signing key file {key_path} holds a {type(key).__name__}, not Ed25519"
        )
    return key


def public_key_pem(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    """Export the public half as PEM SubjectPublicKeyInfo (what verifiers pin)."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def load_public_key(data: bytes | str | Ed25519PublicKey) -> Ed25519PublicKey:
    """Accept a public key as PEM, as 32 raw bytes, or as a key object."""
    if isinstance(data, Ed25519PublicKey):
        return data
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if len(raw) == 32:
        return Ed25519PublicKey.from_public_bytes(raw)
    try:
        key = serialization.load_pem_public_key(raw)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise AuditKeyError(f"not a PEM public key: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise AuditKeyError(f"public key is a {type(key).__name__}, not Ed25519")
    return key


def load_pinned_key(data: bytes | str | Ed25519PublicKey) -> Ed25519PublicKey:
    """``load_public_key`` for a verifier: a key that cannot be read is a VerificationError
    (naming what is wrong with it), so a verifier fails one way whatever it was handed."""
    from audit.errors import VerificationError

    try:
        return load_public_key(data)
    except (AuditKeyError, ValueError, TypeError) as exc:
        raise VerificationError(f"the pinned public key cannot be used: {exc}") from None


def raw_public_key(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    """Return the 32 raw bytes of the public key."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """Return hex SHA-256 of the raw 32-byte public key."""
    return sha256(raw_public_key(key)).hexdigest()


def note_key_id(name: str, key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    """Return the 4-byte C2SP note key id for ``name`` and this Ed25519 key."""
    return sha256(name.encode() + b"\n" + ED25519_NOTE_ALGORITHM + raw_public_key(key)).digest()[:4]


class RetiredAt(NamedTuple):
    """Where a rotated-out key stopped signing: the log's tree size and root when the key
    after it became current (recorded under the log's append lock, ``audit.keyring``)."""

    tree_size: int
    root: bytes
    #: Set when a log restart moved this point down to where the log restarted (``uprof
    #: restore --restart-audit-log``, a ``log_restart`` record of the key history): the
    #: tree size of the point the restart abandoned. Only for the refusals' wording.
    abandoned: int | None = None

    def restart_note(self) -> str:
        """What a refusal adds for a point a log restart set: why the range above it is
        gone."""
        if self.abandoned is None:
            return ""
        return (
            f"; the audit log was restarted at tree size {self.tree_size} from a backup (a "
            "log_restart record of the key history, `uprof restore --restart-audit-log`), "
            f"abandoning what was logged up to tree size {self.abandoned}: a checkpoint of "
            "the abandoned range is not of this log, and nothing can prove it is"
        )


#: What a verifier is given for a statement below its key's rotation point: the log's
#: consistency proof from the statement's tree size m to the point N (base64 hashes), a
#: callable ``(m, N) -> hashes`` (a verifier that holds the log asks it), or None.
RotationProof: TypeAlias = Sequence[str] | Callable[[int, int], Sequence[str]] | None


class _HeldByReader(tuple[str, ...]):
    """The type of ``HELD_BY_READER`` (a sequence, so it passes where a proof does)."""


#: ``verify_checkpoint(..., rotation_proof=HELD_BY_READER)``: the note is one the reader
#: chose to trust (a trusted checkpoint handed in, the log's own anchor, a receipt whose
#: later proof ``verify_proof`` checks itself), not a statement someone hands them: a
#: forged one only makes the checks that compare with it fail, so it needs no proof.
HELD_BY_READER: Sequence[str] = _HeldByReader(("held by the reader",))

#: Where a holder gets what a retired key's statement below its point needs.
ROTATION_PROOF_SOURCE = (
    "`uprof audit rotation-proof FILE --out proof.json`, `POST /v1/audit/rotation-proof`, "
    "SDK `audit_rotation_proof`"
)


class TrustedKeys(tuple[Ed25519PublicKey, ...]):
    """The keys a verifier accepts, as ranges: a key of ``retired_at`` signs checkpoints of
    at most its recorded tree size (and, at that size, only the recorded root); any other
    key signs any size (the current key, or an old key rotated out before the history
    recorded where: a v1 rotation, unbounded).

    A tuple, so every place that took a flat key list still does; the ranges travel with
    it to ``audit.checkpoint.verify_checkpoint``, the one place that applies them."""

    retired_at: Mapping[str, RetiredAt]
    _by_size: Mapping[int, tuple[RetiredAt, ...]] | None

    def __new__(
        cls,
        keys: Iterable[Ed25519PublicKey],
        retired_at: Mapping[str, RetiredAt] | None = None,
    ) -> TrustedKeys:
        self = super().__new__(cls, keys)
        self.retired_at = dict(retired_at or {})
        self._by_size = None
        return self

    @property
    def unbounded_retired(self) -> int:
        """How many keys other than the newest have no recorded retirement point (rotated
        out by a v1 history record): their signatures are accepted at any size."""
        return max(len(self) - 1 - len(self.retired_at), 0)

    def check_signed_range(self, key: Ed25519PublicKey, tree_size: int, root: bytes | None) -> None:
        """Raise VerificationError when ``key`` signed a checkpoint outside its range.

        ``root`` None: a signed document that names a log size but no root (a backup
        manifest, bug KO of decision 0165-review-of-0160), bounded by its size alone."""
        bound = self.retired_at.get(key_id(key))
        if bound is None:
            return
        if tree_size > bound.tree_size:
            raise VerificationError(
                f"checkpoint of tree size {tree_size} is signed by key {key_id(key)[:16]}…, "
                f"which was rotated out at tree size {bound.tree_size}: a retired key "
                "vouches for nothing after its rotation (a leaked or backed-up old key?)"
                + bound.restart_note()
            )
        if tree_size == bound.tree_size and root is not None and root != bound.root:
            raise VerificationError(
                f"checkpoint of tree size {tree_size} by key {key_id(key)[:16]}… names "
                "another root than the one the key history recorded when that key was "
                "rotated out: the checkpoint forks the log" + bound.restart_note()
            )

    def check_log_root(self, tree_size: int, root: bytes) -> None:
        """Raise VerificationError when the history records a rotation point at
        ``tree_size`` whose root is not ``root``, the log's own root there (bug MQ,
        ``AuditLog.verify_integrity``): the log forks what a retired key signed. Without
        this, a log opened without its key folder's anchor verified whatever it held past
        a point; the anchor caught it only where there is one."""
        for point in self._points_at().get(tree_size, ()):
            if point.root != root:
                raise VerificationError(
                    f"the audit log's first {tree_size} entries do not hash to the root the "
                    "key history recorded when a key was rotated out at that size: the log "
                    "forks what that key signed (rewritten, or a backup's log grown past "
                    "the point; see `uprof restore --restart-audit-log`)" + point.restart_note()
                )

    def _points_at(self) -> Mapping[int, tuple[RetiredAt, ...]]:
        """The recorded points by tree size (built once: the integrity check asks per
        entry)."""
        if self._by_size is None:
            by_size: dict[int, tuple[RetiredAt, ...]] = {}
            for point in self.retired_at.values():
                by_size[point.tree_size] = (*by_size.get(point.tree_size, ()), point)
            self._by_size = by_size
        return self._by_size

    def check_vouches_alone(self, key: Ed25519PublicKey, what: str) -> None:
        """Raise VerificationError when ``key`` was rotated out at a recorded point: for a
        signed document that names no root (a backup manifest, ``what``), nothing can show
        it is of the log the key stopped at, so a retired key's signature on it is that
        key's word alone, which whoever holds a leaked copy gives to anything (bug LM,
        decision 0175-retired-below). Its size above the point is ``check_signed_range``'s
        refusal (bug KO); this one is for sizes at or below it. A key a v1 record retired
        stays unbounded, as everywhere."""
        point = self.retired_at.get(key_id(key))
        if point is not None:
            raise VerificationError(
                f"{what} is signed by key {key_id(key)[:16]}…, which was rotated out at tree "
                f"size {point.tree_size}: it names no root that a consistency proof could "
                "take to that point, so it rests on the retired key's word alone"
            )

    def only(self, key: Ed25519PublicKey) -> TrustedKeys:
        """``key`` alone, with its range: for a document that names the key signing it
        (an export's header, a proof document), whose checkpoint must be that key's."""
        point = self.retired_at.get(key_id(key))
        return TrustedKeys([key], {} if point is None else {key_id(key): point})

    def point_below(
        self, signers: Iterable[Ed25519PublicKey], tree_size: int
    ) -> tuple[str, RetiredAt] | None:
        """The rotation point a checkpoint of ``tree_size`` must be proven to reach, or None
        when one of its ``signers`` vouches for it alone (a current key, a key a v1 record
        left unbounded, a retired key at its point, whose root ``check_signed_range``
        compared, or the empty tree, which every log extends)."""
        below: list[tuple[str, RetiredAt]] = []
        for key in signers:
            point = self.retired_at.get(key_id(key))
            if point is None or tree_size >= point.tree_size or tree_size == 0:
                return None
            below.append((key_id(key), point))
        return min(below, key=lambda item: item[1].tree_size) if below else None

    def check_reaches_point(
        self,
        signers: Iterable[Ed25519PublicKey],
        tree_size: int,
        root: bytes,
        rotation_proof: RotationProof,
    ) -> RetiredAt | None:
        """Bugs KG, LK, LL (decisions 0160-rotation-bound, 0175-retired-below): a tree of
        size m < N signed only by a key the history says was rotated out at (N, R) rests
        on that key's word, and whoever holds a leaked copy of it signs a tree of their own
        of any size up to N. It verifies only with ``rotation_proof``, the log's
        consistency proof from (m, root) to (N, R): the tree is then the one the history
        says the key stopped at. Return the point reached (None: none was needed)."""
        if rotation_proof is HELD_BY_READER:
            return None
        needed = self.point_below(signers, tree_size)
        if needed is None:
            return None
        signer, point = needed
        if callable(rotation_proof):
            rotation_proof = rotation_proof(tree_size, point.tree_size)
        if rotation_proof is None:
            raise VerificationError(
                f"the checkpoint of size {tree_size} is signed by key {signer[:16]}…, which "
                f"was rotated out at tree size {point.tree_size}, after its checkpoint of "
                f"size {tree_size}: it verifies only with the rotation proof from "
                f"{tree_size} to {point.tree_size} (rotation_proof, the log's consistency "
                f"proof; {ROTATION_PROOF_SOURCE} give it)"
            )
        if not isinstance(rotation_proof, list | tuple):
            raise VerificationError("rotation_proof is a list of base64 hashes")
        hashes = [
            b64decode_strict(h, f"rotation_proof hash {i}", size=HASH_SIZE)
            for i, h in enumerate(rotation_proof)
        ]
        try:
            verify_consistency(tree_size, point.tree_size, root, point.root, hashes)
        except VerificationError as exc:
            raise VerificationError(
                f"the tree of size {tree_size} signed by key {signer[:16]}… is not the log "
                "the key history says that key stopped at (rotation_proof: "
                f"{exc.reason}): a retired key's fork"
            ) from None
        return point
