"""Audit signing key rotation: a signed key history and the key folder's current key.

The key history is a public JSON document (``HISTORY_FORMAT``)::

    {"format": "uprof.audit-key-history/v1",
     "keys": [{"seq": 0, "key_id": <hex SHA-256 of the raw public key>,
               "public_key": <base64 of the 32 raw bytes>, "created_at": <log time>,
               "prev_sha256": null, "endorsement": null, "acceptance": <base64 sig>},
              {"seq": 1, ..., "prev_sha256": <hex SHA-256 of RFC 8785(record 0)>,
               "endorsement": <base64 sig by key 0>, "acceptance": <base64 sig by key 1>},
              ...]}

Each record's *statement* is its ``seq``, ``key_id``, ``public_key``, ``created_at`` and
``prev_sha256`` plus ``"type": STATEMENT_TYPE``; both signatures are Ed25519 over
``HISTORY_CONTEXT || RFC 8785(statement)``. The *endorsement* is the previous key's (a
new key is current only if the key before it said so); the *acceptance* is the record's
own key's (it holds the private half, and, through ``prev_sha256``, it vouches for every
record before it). So the history verifies in both directions from whichever of its keys
a verifier trusts: forward by endorsements, backward by acceptances over the hash chain.
``verify_key_history`` accepts a history only when every link holds and the trusted key
is one of its keys; anything else (a forged or re-ordered record, a history of another
deployment, a key nobody endorsed) is refused whole.

A v2 history (``HISTORY_FORMAT_V2``, decision 0160-rotation-bound) adds to each record a
rotation writes ``previous_key_retired_at``: the log's tree size and root, read under the
log's append lock, at which the key before stopped signing; it is in the statement both
keys sign. ``KeyHistory.trusted`` gives the keys as ranges (``audit.keys.TrustedKeys``),
which ``audit.checkpoint.verify_checkpoint`` applies for every verifier.

Retired private keys are not kept: verifying needs only the public keys of the history.

``FileKeyRing`` keeps the current private key (``audit-signing.pem``, as before) and the
history (``audit-keys.json``) in the key folder, and rotates under an exclusive ``flock``
so that two processes rotating at once make two successive rotations. A rotation writes
the new private key to ``audit-signing.next.pem``, then the history naming it (the commit
point), then renames the new key over the current one. A process killed before the
history write leaves the old key current (the stray next key is removed later); killed
after it, the next opening of the ring finishes the rename. At no point is a key current
that the history does not name, and there is one current key file.

``FileKeyRing`` is also the log's ``audit.log.CheckpointAnchor``: ``audit-checkpoint.note``
holds the newest checkpoint note the log signed, only ever replaced by a larger one (under
the ``flock`` of ``audit-checkpoint.lock``, through a synced temporary file and a rename),
so a log database put back from an older copy is told from one that grew.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from hashlib import sha256
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from audit._codec import b64decode_strict, b64encode, hexdecode_strict
from audit.canonical import canonical_bytes
from audit.entry import format_timestamp, normalise_timestamp
from audit.errors import AuditEntryError, AuditKeyError, VerificationError
from audit.keys import (
    RetiredAt,
    TrustedKeys,
    key_id,
    load_or_create_signing_key,
    load_pinned_key,
    load_signing_key,
)
from audit.lockfile import open_lock_file
from audit.merkle import HASH_SIZE
from audit.strict_json import strict_json

HISTORY_FORMAT = "uprof.audit-key-history/v1"
#: A history that records where each rotated-out key stopped signing (decision
#: 0160-rotation-bound): written by every rotation from now on. A v1 verifier refuses it
#: whole (fail closed) rather than read it as a flat key list.
HISTORY_FORMAT_V2 = "uprof.audit-key-history/v2"
#: A history holding a log restart (``LOG_RESTART``, ``uprof restore
#: --restart-audit-log``): every later record keeps it. A v2 verifier refuses it whole.
HISTORY_FORMAT_V3 = "uprof.audit-key-history/v3"
HISTORY_FORMATS = frozenset({HISTORY_FORMAT, HISTORY_FORMAT_V2, HISTORY_FORMAT_V3})
STATEMENT_TYPE = "uprof.audit-key/v1"
#: The statement of a record that names where the key before it was retired.
STATEMENT_TYPE_V2 = "uprof.audit-key/v2"
#: The statement of a record that also restarts the log (``LOG_RESTART``).
STATEMENT_TYPE_V3 = "uprof.audit-key/v3"
#: The field of a v2 record: ``{"tree_size": n, "root": <base64 root>}``, the log's head
#: under its append lock when this record's key replaced the one before.
RETIRED_AT = "previous_key_retired_at"
#: The field of a restart record: ``{"abandoned": {"tree_size": N, "root": <base64>}}``,
#: the highest rotation point recorded before it, which the log (put back from a backup
#: of fewer entries) no longer reaches. The record's ``RETIRED_AT`` is where the log
#: restarts (its head, under its append lock), and every earlier point above it moves
#: down to it: a retired key then vouches, with a proof, only for what the restarted log
#: holds, and whole trails pass through the restart's point instead of the abandoned one.
LOG_RESTART = "log_restart"
#: Domain separation: no checkpoint (origin first), JSON body ("{") or export context
#: starts with these bytes.
HISTORY_CONTEXT = b"uprof audit key history v1\x00"
RECORD_KEYS = frozenset(
    {"seq", "key_id", "public_key", "created_at", "prev_sha256", "endorsement", "acceptance"}
)
#: A history longer than this is refused (a rotation a day for ten years fits).
MAX_KEYS = 4096

KEY_FILE = "audit-signing.pem"
NEXT_KEY_FILE = "audit-signing.next.pem"
HISTORY_FILE = "audit-keys.json"
LOCK_FILE = "audit-keys.lock"
#: The newest checkpoint the log signed (its note), kept apart from the log (bug HE).
ANCHOR_FILE = "audit-checkpoint.note"
ANCHOR_LOCK_FILE = "audit-checkpoint.lock"


# --- the document ---------------------------------------------------------------------------


def _statement(record: Mapping[str, Any]) -> bytes:
    statement = {
        "type": (
            STATEMENT_TYPE_V3
            if LOG_RESTART in record
            else STATEMENT_TYPE_V2
            if RETIRED_AT in record
            else STATEMENT_TYPE
        ),
        "seq": record["seq"],
        "key_id": record["key_id"],
        "public_key": record["public_key"],
        "created_at": record["created_at"],
        "prev_sha256": record["prev_sha256"],
    }
    if RETIRED_AT in record:
        # Signed by both keys: the old key agrees it stops here, the new one that it
        # starts here (neither can later move the point alone).
        statement[RETIRED_AT] = record[RETIRED_AT]
    if LOG_RESTART in record:
        # Signed by both keys too: the current key vouches for the restart (the
        # operator's choice), the new key accepts starting there.
        statement[LOG_RESTART] = record[LOG_RESTART]
    return HISTORY_CONTEXT + canonical_bytes(statement)


def record_sha256(record: Mapping[str, Any]) -> str:
    """Hex SHA-256 of a history record's RFC 8785 bytes (signatures included)."""
    return sha256(canonical_bytes(dict(record))).hexdigest()


def _raw(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _new_record(
    key: Ed25519PrivateKey,
    created_at: str,
    previous: Mapping[str, Any] | None,
    previous_key: Ed25519PrivateKey | None,
    retired_at: RetiredAt | None = None,
    abandons: RetiredAt | None = None,
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "seq": 0 if previous is None else int(previous["seq"]) + 1,
        "key_id": key_id(key),
        "public_key": b64encode(_raw(key)),
        "created_at": created_at,
        "prev_sha256": None if previous is None else record_sha256(previous),
        "endorsement": None,
    }
    if retired_at is not None:
        record[RETIRED_AT] = {
            "tree_size": retired_at.tree_size,
            "root": b64encode(retired_at.root),
        }
    if abandons is not None:
        record[LOG_RESTART] = {
            "abandoned": {"tree_size": abandons.tree_size, "root": b64encode(abandons.root)}
        }
    message = _statement(record)
    if previous_key is not None:
        record["endorsement"] = b64encode(previous_key.sign(message))
    record["acceptance"] = b64encode(key.sign(message))
    return record


def genesis_history(key: Ed25519PrivateKey, created_at: str) -> dict[str, Any]:
    """A history of one key (the first key a deployment used)."""
    return {"format": HISTORY_FORMAT, "keys": [_new_record(key, created_at, None, None)]}


def extend_history(
    history: Mapping[str, Any],
    current: Ed25519PrivateKey,
    new: Ed25519PrivateKey,
    created_at: str,
    retired_at: RetiredAt | None = None,
    abandons: RetiredAt | None = None,
) -> dict[str, Any]:
    """``history`` with ``new`` endorsed by ``current`` (which must be its last key);
    with ``retired_at`` (the log's head when ``current`` stops signing) a v2 history;
    with ``abandons`` (the point a log restart gives up, ``LOG_RESTART``) a v3 one."""
    records = list(history["keys"])
    if records[-1]["key_id"] != key_id(current):
        raise AuditKeyError("only the history's last key can endorse the next one")
    if abandons is not None and retired_at is None:
        raise AuditKeyError("a log restart records where the log restarts (retired_at)")
    added = _new_record(new, created_at, records[-1], current, retired_at, abandons)
    document_format = history["format"]
    if abandons is not None:
        document_format = HISTORY_FORMAT_V3
    elif retired_at is not None and document_format != HISTORY_FORMAT_V3:
        document_format = HISTORY_FORMAT_V2
    return {"format": document_format, "keys": [*records, added]}


@dataclass(frozen=True)
class KeyHistory:
    """A verified history: its keys in order (oldest first) and the document."""

    keys: tuple[Ed25519PublicKey, ...]
    key_ids: tuple[str, ...]
    document: Mapping[str, Any]
    #: Where each rotated-out key stopped signing, by key id (v2 records only: a key
    #: rotated out by a v1 record has no entry and stays unbounded).
    retired_at: Mapping[str, RetiredAt] = field(default_factory=dict)

    @property
    def trusted(self) -> TrustedKeys:
        """The keys as ranges (``audit.keys.TrustedKeys``), for every verifier."""
        return TrustedKeys(self.keys, self.retired_at)

    def key(self, wanted: str) -> Ed25519PublicKey | None:
        """The endorsed key with hex id ``wanted``, or None."""
        for candidate, candidate_id in zip(self.keys, self.key_ids, strict=True):
            if candidate_id == wanted:
                return candidate
        return None

    @property
    def current_key_id(self) -> str:
        return self.key_ids[-1]


def parse_key_history(raw: bytes | str) -> Any:
    """Read a key history file strictly (``strict_json``)."""
    return strict_json(raw, "key history")


def verify_key_history(
    history: Any, trusted: Ed25519PublicKey | bytes | str | Sequence[Ed25519PublicKey]
) -> KeyHistory:
    """Verify every link of ``history`` and that it names the ``trusted`` key (or one of
    several); return the keys it endorses. Raise VerificationError otherwise."""
    if isinstance(history, bytes | str):
        history = parse_key_history(history)
    if (
        not isinstance(history, Mapping)
        or set(history) != {"format", "keys"}
        or not any(history["format"] == known for known in HISTORY_FORMATS)
    ):
        raise VerificationError(
            f"a key history is {{'format': {HISTORY_FORMAT_V3!r} (or {HISTORY_FORMAT_V2!r}, "
            f"{HISTORY_FORMAT!r}), 'keys': [...]}}"
        )
    records = history["keys"]
    if not isinstance(records, list) or not 1 <= len(records) <= MAX_KEYS:
        raise VerificationError(f"a key history holds 1 to {MAX_KEYS} keys")
    keys: list[Ed25519PublicKey] = []
    ids: list[str] = []
    retired_at: dict[str, RetiredAt] = {}
    previous: Mapping[str, Any] | None = None
    for seq, record in enumerate(records):
        where = f"key history record {seq}"
        if (
            not isinstance(record, Mapping)
            or set(record) - {RETIRED_AT, LOG_RESTART} != RECORD_KEYS
        ):
            raise VerificationError(f"{where} needs exactly {sorted(RECORD_KEYS)}")
        if record["seq"] != seq or isinstance(record["seq"], bool):
            raise VerificationError(f"{where} has seq {record['seq']!r}: records were reordered")
        raw = b64decode_strict(record["public_key"], f"{where} public_key", size=32)
        public = Ed25519PublicKey.from_public_bytes(raw)
        hexdecode_strict(record["key_id"], f"{where} key_id", size=32)
        if record["key_id"] != key_id(public):
            raise VerificationError(f"{where}: key_id is not the id of its public key")
        if record["key_id"] in ids:
            raise VerificationError(f"{where}: the key appears twice in the history")
        created_at = record["created_at"]
        try:
            if not isinstance(created_at, str) or normalise_timestamp(created_at) != created_at:
                raise AuditEntryError("created_at")
        except AuditEntryError:
            raise VerificationError(
                f"{where}: created_at is not a time in the log's form"
            ) from None
        if previous is not None and created_at < previous["created_at"]:
            raise VerificationError(f"{where} was created before the key it follows")
        expected_prev = None if previous is None else record_sha256(previous)
        if record["prev_sha256"] != expected_prev:
            raise VerificationError(
                f"{where} does not follow the record before it (prev_sha256): the history "
                "was edited, truncated or spliced"
            )
        message = _statement(record)
        _check_signature(public, record["acceptance"], message, f"{where} acceptance")
        if previous is None:
            if record["endorsement"] is not None:
                raise VerificationError(f"{where}: the first key has no endorsement")
        else:
            if record["endorsement"] is None:
                raise VerificationError(f"{where}: the key is endorsed by nobody")
            _check_signature(keys[-1], record["endorsement"], message, f"{where} endorsement")
        if RETIRED_AT in record:
            if history["format"] == HISTORY_FORMAT or previous is None:
                raise VerificationError(
                    f"{where}: {RETIRED_AT} belongs to a rotation record of a "
                    f"{HISTORY_FORMAT_V2} history"
                )
            point = _retired_at(record[RETIRED_AT], where)
            if LOG_RESTART in record:
                point = _restarted(record[LOG_RESTART], point, retired_at, history, where)
            elif retired_at and point.tree_size < max(p.tree_size for p in retired_at.values()):
                raise VerificationError(
                    f"{where}: {RETIRED_AT}.tree_size {point.tree_size} is below an earlier "
                    "rotation's: the log cannot shrink"
                )
            retired_at[ids[-1]] = point
        elif LOG_RESTART in record:
            raise VerificationError(f"{where}: {LOG_RESTART} without {RETIRED_AT}")
        keys.append(public)
        ids.append(record["key_id"])
        previous = record
    anchors = (
        list(trusted)
        if isinstance(trusted, Sequence) and not isinstance(trusted, bytes | str)
        else [load_pinned_key(trusted)]
    )
    if not any(key_id(anchor) in ids for anchor in anchors):
        raise VerificationError(
            "the trusted public key is not in this key history: it belongs to another "
            "deployment, or it was replaced"
        )
    return KeyHistory(tuple(keys), tuple(ids), history, retired_at)


def _restarted(
    value: Any,
    point: RetiredAt,
    retired_at: dict[str, RetiredAt],
    history: Mapping[str, Any],
    where: str,
) -> RetiredAt:
    """Apply a log restart record (``LOG_RESTART``) whose log restarts at ``point``: it must
    name, as the point it abandons, the highest one recorded before it, above ``point``;
    every earlier point above ``point`` moves down to it (``retired_at`` updated in place).
    Return the record's own point, marked as a restart's."""
    if history["format"] != HISTORY_FORMAT_V3:
        raise VerificationError(
            f"{where}: {LOG_RESTART} belongs to a record of a {HISTORY_FORMAT_V3} history"
        )
    if not isinstance(value, Mapping) or set(value) != {"abandoned"}:
        raise VerificationError(f"{where}: {LOG_RESTART} is {{'abandoned': {{...}}}}")
    abandoned = _retired_at(value["abandoned"], f"{where} {LOG_RESTART}")
    highest = max(retired_at.values(), key=lambda p: p.tree_size, default=None)
    if highest is None or (abandoned.tree_size, abandoned.root) != (
        highest.tree_size,
        highest.root,
    ):
        raise VerificationError(
            f"{where}: {LOG_RESTART} does not abandon the highest rotation point recorded "
            "before it: a restart gives up that point and only that one"
        )
    if point.tree_size >= abandoned.tree_size:
        raise VerificationError(
            f"{where}: a log restart at tree size {point.tree_size} abandons nothing below "
            f"the point at {abandoned.tree_size}"
        )
    if any(p.tree_size == point.tree_size and p.root != point.root for p in retired_at.values()):
        raise VerificationError(
            f"{where}: the log restarts at tree size {point.tree_size} with another root than "
            "the rotation point recorded there"
        )
    moved = RetiredAt(point.tree_size, point.root, abandoned.tree_size)
    for key, earlier in list(retired_at.items()):
        if earlier.tree_size > point.tree_size:
            retired_at[key] = moved
    return moved


def _retired_at(value: Any, where: str) -> RetiredAt:
    if not isinstance(value, Mapping) or set(value) != {"tree_size", "root"}:
        raise VerificationError(f"{where}: {RETIRED_AT} is {{'tree_size': n, 'root': <base64>}}")
    size = value["tree_size"]
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size < 2**63:
        raise VerificationError(f"{where}: {RETIRED_AT}.tree_size is not a tree size")
    root = b64decode_strict(value["root"], f"{where} {RETIRED_AT}.root", size=HASH_SIZE)
    return RetiredAt(size, root)


def _check_signature(key: Ed25519PublicKey, text: Any, message: bytes, what: str) -> None:
    signature = b64decode_strict(text, what, size=64)
    try:
        key.verify(signature, message)
    except InvalidSignature:
        raise VerificationError(f"{what} does not verify") from None


def trusted_keys(
    public_key: Ed25519PublicKey | bytes | str | Sequence[Ed25519PublicKey],
    key_history: Any = None,
) -> TrustedKeys:
    """The keys a verifier accepts, as ranges (``TrustedKeys``): the pinned key alone, or
    with ``key_history`` every key of that history (verified, and naming the pinned key),
    each rotated-out key bounded where a v2 history recorded its retirement. A sequence of
    keys is taken as the already-trusted set (its ranges kept)."""
    if isinstance(public_key, TrustedKeys):
        anchors: Sequence[Ed25519PublicKey] = public_key
    elif isinstance(public_key, Sequence) and not isinstance(public_key, bytes | str):
        anchors = TrustedKeys(public_key)
    else:
        anchors = TrustedKeys([load_pinned_key(public_key)])
    if key_history is None:
        return anchors if isinstance(anchors, TrustedKeys) else TrustedKeys(anchors)
    return verify_key_history(key_history, list(anchors)).trusted


def key_by_id(keys: Sequence[Ed25519PublicKey], wanted: object) -> Ed25519PublicKey | None:
    for candidate in keys:
        if key_id(candidate) == wanted:
            return candidate
    return None


# --- key sources ---------------------------------------------------------------------------


class SigningKeys(Protocol):
    """Where an ``AuditLog`` gets its current signing key and the keys it trusts."""

    def current(self) -> Ed25519PrivateKey:
        """The key new signatures are made with."""
        ...

    def trusted(self) -> Sequence[Ed25519PublicKey]:
        """Every key whose signatures the log accepts (the endorsed history)."""
        ...


class StaticSigningKeys:
    """One key, never rotated (tests, and a log built around a bare key)."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key

    def current(self) -> Ed25519PrivateKey:
        return self._key

    def trusted(self) -> Sequence[Ed25519PublicKey]:
        return (self._key.public_key(),)


@dataclass(frozen=True)
class Rotation:
    """What a rotation did."""

    seq: int
    previous_key_id: str
    key_id: str
    created_at: str


def _now() -> str:
    return format_timestamp(datetime.now(UTC))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_private(path: Path, data: bytes, *, sync_folder: bool = True) -> None:
    """Write ``data`` to ``path`` (mode 0600) through a synced temporary file and a rename
    (and the folder synced after it, unless ``sync_folder`` is false)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if sync_folder:
        _fsync_dir(path.parent)


def _pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class FileKeyRing:
    """The audit key in a key folder: ``audit-signing.pem`` (current), ``audit-keys.json``
    (the history), ``audit-keys.lock`` (rotations and repairs hold its ``flock``).

    ``current()`` notices a rotation by another process (the key file's inode changes on
    each rotation: one ``stat`` per signature), so every process signs with the new key
    from its next signature on.
    """

    def __init__(self, folder: Path, *, clock: Any = _now) -> None:
        self.folder = folder
        self._clock = clock
        self._key: Ed25519PrivateKey | None = None
        self._key_stamp: tuple[int, int] | None = None
        self._history: KeyHistory | None = None
        self._history_stamp: tuple[int, int, int] | None = None
        self._opened = False

    @property
    def key_path(self) -> Path:
        return self.folder / KEY_FILE

    @property
    def history_path(self) -> Path:
        return self.folder / HISTORY_FILE

    @contextmanager
    def _lock(self) -> Iterator[None]:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = open_lock_file(self.folder / LOCK_FILE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # -- the checkpoint anchor (audit.log.CheckpointAnchor)

    @property
    def anchor_path(self) -> Path:
        return self.folder / ANCHOR_FILE

    @contextmanager
    def _anchor_lock(self) -> Iterator[None]:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = open_lock_file(self.folder / ANCHOR_LOCK_FILE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def anchored_checkpoint(self) -> str | None:
        """The newest checkpoint note the log signed, or None (none signed since the
        anchor existed, or forgotten by a restore). Its signature is checked by the log."""
        try:
            raw = self.anchor_path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise VerificationError(f"{self.anchor_path} is not a checkpoint note") from None

    def raise_checkpoint_anchor(self, tree_size: int, note: str) -> None:
        """Keep ``note`` unless the kept note is of at least ``tree_size`` entries."""
        with self._anchor_lock():
            kept = self.anchored_checkpoint()
            if kept is not None and _note_size(kept) >= tree_size:
                return
            for leftover in self.folder.glob(f".{ANCHOR_FILE}.*.tmp"):
                leftover.unlink(missing_ok=True)  # a write killed before its rename
            # The note is synced before its rename, the folder not after: a crash may lose
            # the rename, leaving the anchor behind (safe: it only ever lags), never torn.
            _write_private(self.anchor_path, note.encode("utf-8"), sync_folder=False)

    def forget_checkpoint_anchor(self) -> None:
        with self._anchor_lock():
            if self.anchor_path.exists():
                self.anchor_path.unlink()
                _fsync_dir(self.folder)

    # -- opening and repair

    def _open(self) -> None:
        if not self._opened:
            with self._lock():
                self._repair_locked()
            self._opened = True

    def _repair_locked(self) -> None:
        """Bring the folder to a state with one current key that the history names last:
        create the first key and history, finish a rotation killed after its commit
        point, drop a next key a rotation killed before it left, and the temporary files
        of a write it was killed in (one may hold a private key nobody will use: every
        writer of these files holds the lock, so none is being written now)."""
        for name in (NEXT_KEY_FILE, HISTORY_FILE):
            for leftover in self.folder.glob(f".{name}.*.tmp"):
                leftover.unlink(missing_ok=True)
        key = load_or_create_signing_key(self.key_path)
        if not self.history_path.exists():
            _write_private(self.history_path, _history_bytes(genesis_history(key, self._clock())))
        document = self._read_history_document()
        last_id = document["keys"][-1]["key_id"]
        next_path = self.folder / NEXT_KEY_FILE
        if key_id(key) != last_id:
            if next_path.exists() and key_id(load_signing_key(next_path)) == last_id:
                os.replace(next_path, self.key_path)  # roll the killed rotation forward
                _fsync_dir(self.folder)
                key = load_signing_key(self.key_path)
            else:
                raise AuditKeyError(
                    f"the audit key history ({self.history_path}) names key "
                    f"{last_id[:16]}… as current but {self.key_path} holds key "
                    f"{key_id(key)[:16]}…: the key file was replaced by hand or the folder "
                    "was put together from different copies; put back the matching files"
                )
        elif next_path.exists():
            next_path.unlink()  # a rotation killed before its commit point
            _fsync_dir(self.folder)
        verify_key_history(document, key.public_key())

    def _read_history_document(self) -> Any:
        try:
            raw = self.history_path.read_bytes()
        except FileNotFoundError:
            raise AuditKeyError(f"the audit key history {self.history_path} is missing") from None
        try:
            document = parse_key_history(raw)
            verify_key_history(document, [_anchor_of(document)])
        except VerificationError as exc:
            raise AuditKeyError(f"the audit key history {self.history_path}: {exc}") from None
        return document

    # -- SigningKeys

    def current(self) -> Ed25519PrivateKey:
        self._open()
        if (self.folder / NEXT_KEY_FILE).exists():
            self._finish_killed_rotation()
        stamp = self._key_file_stamp()
        if self._key is None or stamp != self._key_stamp:
            key = load_signing_key(self.key_path)
            if self._key is not None and not self._named_current(key):
                # Read again: a rotation may have renamed its key in between.
                stamp = self._key_file_stamp()
                key = load_signing_key(self.key_path)
                if not self._named_current(key):
                    raise AuditKeyError(
                        f"{self.key_path} now holds key {key_id(key)[:16]}…, which the "
                        f"audit key history ({self.history_path}) does not name as current: "
                        "the key file was replaced by hand (or put back from an older "
                        "copy) under a running process; nothing is signed with it. Put "
                        "back the matching files"
                    )
            self._key, self._key_stamp = key, stamp
        return self._key

    def _finish_killed_rotation(self) -> None:
        """Finish (or drop) a rotation killed with its next key file left, if no rotation
        is alive: bug KN (decision 0165-review-of-0160). A rotation killed after its
        history write (the commit point) and before its rename left the history bounding
        the old key at its point N while the old key file stayed; a process that had the
        ring open kept signing with it, and its log refused every checkpoint beyond N
        (receipts, exports, proofs failed) until a restart's ``_repair_locked``. That
        repair runs here, under the ring's lock taken without waiting: every rotation
        holds that lock from before it writes its next key file until it is done, so a
        lock we get means the file is a dead rotation's; a lock we cannot get means a
        live rotation, whose own rename comes (the in-flight allowance of
        ``_named_current``). Never waiting keeps a caller inside a database write from
        deadlocking with a rotation waiting for the log's append lock."""
        fd = open_lock_file(self.folder / LOCK_FILE)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # a rotation is alive (in this process or another)
            if (self.folder / NEXT_KEY_FILE).exists():
                self._repair_locked()
        finally:
            os.close(fd)

    def _key_file_stamp(self) -> tuple[int, int]:
        try:
            st = os.stat(self.key_path)
        except FileNotFoundError:
            raise AuditKeyError(f"signing key file {self.key_path} does not exist") from None
        return (st.st_ino, st.st_mtime_ns)

    def _named_current(self, key: Ed25519PrivateKey) -> bool:
        """Whether a key file just (re)loaded may be signed with: the history names it
        last, or names it just before the last while the next key file still waits for
        its rename (a rotation between its commit point and its switch). No lock: a
        process may be inside a database write here, and a rotation holds the lock while
        it writes its entry."""
        ids = [record["key_id"] for record in self._read_history_document()["keys"]]
        if ids[-1] == key_id(key):
            return True
        in_flight = len(ids) >= 2 and ids[-2] == key_id(key)
        return in_flight and (self.folder / NEXT_KEY_FILE).exists()

    def history(self) -> KeyHistory:
        """The verified history, anchored at the current key (cached until the file changes)."""
        current = self.current()
        st = os.stat(self.history_path)
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._history
        if cached is None or stamp != self._history_stamp or key_id(current) not in cached.key_ids:
            document = self._read_history_document()
            try:
                cached = verify_key_history(document, current.public_key())
            except VerificationError as exc:
                raise AuditKeyError(f"the audit key history {self.history_path}: {exc}") from None
            self._history, self._history_stamp = cached, stamp
        return cached

    def trusted(self) -> TrustedKeys:
        return self.history().trusted

    # -- rotation

    @contextmanager
    def settled(self) -> Iterator[Mapping[str, Any]]:
        """The history document while no rotation is in progress (under the rotations'
        lock, a killed one repaired): a caller recording the rotations that are not on the
        log yet sees only those whose process died or finished, never one about to record
        its own entry."""
        with self._lock():
            self._repair_locked()
            self._opened = True
            yield self._read_history_document()

    def rotate(
        self,
        record: Callable[[Rotation, Mapping[str, Any]], None] | None = None,
        *,
        log_head: Callable[[], AbstractContextManager[RetiredAt]] | None = None,
        restart: bool = False,
    ) -> Rotation:
        """Make a new key current, endorsed by the current one; return what was done.

        ``log_head()`` (``AuditLog.held_head``): holds the log's append lock and gives its
        size and root. The history records them as where the old key stopped signing, and
        the key file is switched before the lock is let go: a process that reads the log's
        size after it then reads the new key (``current`` stats the key file per call), so
        no checkpoint beyond that size is signed by the old key. Without it (a key ring
        used without a log) the rotation is a v1 one, unbounded.

        ``record(rotation, history)`` runs after the key switch, still under the lock (the
        rotation's audit entry: no other process's ``settled`` can see the rotation first
        and record it as its own).

        ``restart``: the log was put back from a backup of fewer entries than the highest
        rotation point the history records (``uprof restore --restart-audit-log``): the
        record also names that point as abandoned (``LOG_RESTART``), signed by the
        current key and the new one. Refused (``AuditKeyError``, nothing changed) when the
        log reaches every point: there is nothing to restart."""
        if restart and log_head is None:
            raise AuditKeyError("a log restart is recorded at the log's head (log_head)")
        with self._lock():
            self._repair_locked()
            self._opened = True
            current = load_signing_key(self.key_path)
            document = self._read_history_document()
            if len(document["keys"]) >= MAX_KEYS:
                # Refused before anything is written: a longer history would be refused by
                # every verifier, this folder's next opening included.
                raise AuditKeyError(
                    f"the audit key history {self.history_path} holds {MAX_KEYS} keys, the "
                    "most a verifier accepts: no further rotation (nothing was changed)"
                )
            abandons = self._abandoned_point(document) if restart else None
            new = Ed25519PrivateKey.generate()
            next_path = self.folder / NEXT_KEY_FILE
            _write_private(next_path, _pem(new))
            with log_head() if log_head is not None else nullcontext(None) as head:
                size = -1 if head is None else head.tree_size
                if restart and (abandons is None or size >= abandons.tree_size):
                    next_path.unlink()
                    raise AuditKeyError(
                        f"nothing to restart: the audit log holds {size} entries, and the "
                        "key history records no rotation point above that (nothing was "
                        "changed)"
                    )
                created_at = max(self._clock(), document["keys"][-1]["created_at"])
                extended = extend_history(document, current, new, created_at, head, abandons)
                if restart:
                    # Checked as every verifier will before it is the history: a restart
                    # the rules refuse (a log that forks a point below its head) would
                    # leave a key folder nothing opens.
                    try:
                        verify_key_history(extended, [new.public_key()])
                    except VerificationError as exc:
                        next_path.unlink()
                        raise AuditKeyError(
                            f"not restarting the audit log: {exc.reason} (nothing was changed)"
                        ) from None
                _write_private(self.history_path, _history_bytes(extended))  # the commit point
                os.replace(next_path, self.key_path)
                _fsync_dir(self.folder)
            added = extended["keys"][-1]
            done = Rotation(added["seq"], key_id(current), added["key_id"], created_at)
            if record is not None:
                record(done, extended)
            return done

    @staticmethod
    def _abandoned_point(document: Any) -> RetiredAt | None:
        """The highest rotation point a (checked) history document records, or None."""
        points = verify_key_history(document, [_anchor_of(document)]).retired_at
        return max(points.values(), key=lambda p: p.tree_size, default=None)


def _note_size(note: str) -> int:
    """The tree size a checkpoint note names (its second line), -1 if it names none: an
    unreadable kept note is replaced by the next one (the log checks the signature)."""
    lines = note.split("\n")
    return int(lines[1]) if len(lines) > 1 and lines[1].isdigit() else -1


def _anchor_of(document: Any) -> Ed25519PublicKey:
    """The first key a document names (its own anchor: the links are checked, the anchor is
    decided by the caller)."""
    try:
        raw = b64decode_strict(document["keys"][0]["public_key"], "first public_key", size=32)
    except (KeyError, IndexError, TypeError):
        raise VerificationError("a key history holds at least one key") from None
    return Ed25519PublicKey.from_public_bytes(raw)


def _history_bytes(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, indent=1, sort_keys=True).encode("ascii") + b"\n"
