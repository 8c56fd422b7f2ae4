"""Consistency (and inclusion) proofs for readers who hold an old checkpoint.

Whoever kept a checkpoint (from a receipt, an earlier export, a witness) asks the log for a
*proof document*: a fresh signed checkpoint, the RFC 9162 §2.1.4 consistency proof from the
old tree size to it, and optionally the §2.1.3 inclusion proof of one entry against it. The
reader checks it offline with the pinned public key and origin and the note they trusted
before (``verify_proof``); nothing in the document is believed that the pinned key, the
trusted note or the hashes do not show.

The document is one RFC 8785 canonical JSON object followed by ``\\n``::

    {"checkpoint": "<signed note, size n>",
     "consistency": {"hashes": [base64, ...], "old_size": m},
     "format": "uprof.audit-proof/v1",
     "inclusion": null | {"entry": {...}, "hashes": [base64, ...], "leaf_index": i},
     "key_id": "<hex SHA-256 of the public key>",
     "note_key_id": "<hex 4-byte note key id>",
     "origin": "<log origin>",
     "tree_size": n}

Every field is checked by the verifier (the file must be exactly that canonical text), so a
changed byte is either refused or changed nothing.

This module imports no database code; ``build_proof`` takes the log it serves from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from audit._codec import b64decode_strict, b64encode
from audit.canonical import canonical_bytes
from audit.checkpoint import verify_checkpoint
from audit.entry import stored_entry_bytes
from audit.errors import AuditEntryError, VerificationError
from audit.keyring import key_by_id, trusted_keys
from audit.keys import HELD_BY_READER, RotationProof, key_id, note_key_id
from audit.merkle import HASH_SIZE, leaf_hash, verify_consistency, verify_inclusion
from audit.strict_json import strict_json
from domain.errors import InvalidInputError

if TYPE_CHECKING:
    from audit.log import AuditLog, StoredEntry, TenantScope

PROOF_FORMAT = "uprof.audit-proof/v1"
PROOF_KEYS = frozenset(
    {
        "checkpoint",
        "consistency",
        "format",
        "inclusion",
        "key_id",
        "note_key_id",
        "origin",
        "tree_size",
    }
)
CONSISTENCY_KEYS = frozenset({"hashes", "old_size"})
INCLUSION_KEYS = frozenset({"entry", "hashes", "leaf_index"})
#: A proof of a tree of 2**63 leaves has at most 2 * 63 hashes.
MAX_PROOF_HASHES = 130


@dataclass(frozen=True)
class ProofReport:
    """What a verified proof document showed."""

    origin: str
    key_id: str
    old_size: int
    old_root: bytes
    tree_size: int
    root: bytes
    leaf_index: int | None = None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _requested_size(value: Any, field: str, *, minimum: int) -> int:
    if not _is_int(value):
        raise InvalidInputError(f"{field} must be an integer", field=field)
    if value < minimum:
        raise InvalidInputError(f"{field} must be at least {minimum}, got {value}", field=field)
    return int(value)


def _admitted(scope: TenantScope, stored: StoredEntry) -> bool:
    """Whether the scope admits the entry; a row that is not JSON is left to
    ``_stored_entry``, which reports it as the integrity failure it is."""
    try:
        return scope.admits(stored)
    except (ValueError, AttributeError):
        return True


def build_proof(
    log: AuditLog,
    old_size: int,
    *,
    leaf_index: int | None = None,
    scope: TenantScope | None = None,
) -> dict[str, Any]:
    """Sign a fresh checkpoint and return the proof document from ``old_size`` up to it.

    ``old_size`` is the tree size of the checkpoint the reader holds (at least 1: every
    log extends the empty tree); ``leaf_index``, if given, adds that entry and its
    inclusion proof against the fresh checkpoint. Every proof is against the checkpoint
    the document carries, so appends by other writers meanwhile do not matter.

    Raises InvalidInputError naming ``old_size`` or ``leaf_index`` when it is not an
    integer, is too small, or lies beyond the log; VerificationError when the log's
    tables lack a row the proof needs (an entry or a node deleted behind its back) or the
    asked entry's row holds a text the log never stores (a float, another spelling, a
    duplicate key, a field outside the allowlist, a leaf hash not its own): an integrity
    failure of the log, never the caller's input error.

    With ``scope`` (a tenant's reader, ``AuditLog.tenant_scope``), an entry the scope does
    not admit is refused exactly as an index beyond the log is, one message for both: the
    consistency proof reveals only hashes, the entry would reveal another tenant's doings.
    """
    old_size = _requested_size(old_size, "old_size", minimum=1)
    if leaf_index is not None:
        leaf_index = _requested_size(leaf_index, "leaf_index", minimum=0)
    signing_key = log.signing_key()  # the document names one key, whatever rotates meanwhile
    checkpoint = log.checkpoint_record(key=signing_key)
    size = checkpoint.tree_size
    if old_size > size:
        raise InvalidInputError(
            f"old_size {old_size} is beyond the log, which holds {size} entries", field="old_size"
        )
    inclusion = None
    if leaf_index is not None:
        unseen = InvalidInputError(
            f"leaf_index {leaf_index} is beyond the log, which holds {size} entries"
            if scope is None
            else f"leaf_index {leaf_index} names no entry of the log that this tenant may "
            "read (beyond the log, or another tenant's)",
            field="leaf_index",
        )
        if leaf_index >= size:
            raise unseen
        stored = next(
            iter(log.entries(tree_size=size, after_leaf=leaf_index - 1, page_size=1)), None
        )
        if stored is None or stored.leaf_index != leaf_index:
            # Never the next entry under this index: its tables lost a row.
            raise VerificationError(
                f"the log has no entry at leaf_index {leaf_index}: its tables are incomplete"
            )
        if scope is not None and not _admitted(scope, stored):
            raise unseen
        inclusion = {
            "entry": _stored_entry(stored),
            "hashes": [b64encode(h) for h in log.inclusion_proof(leaf_index, size)],
            "leaf_index": leaf_index,
        }
    return {
        "checkpoint": checkpoint.note,
        "consistency": {
            "hashes": [b64encode(h) for h in log.consistency_proof(old_size, size)],
            "old_size": old_size,
        },
        "format": PROOF_FORMAT,
        "inclusion": inclusion,
        "key_id": key_id(signing_key),
        "note_key_id": note_key_id(log.origin, signing_key).hex(),
        "origin": log.origin,
        "tree_size": size,
    }


def _stored_entry(stored: StoredEntry) -> dict[str, Any]:
    """The entry of a row, if its text is one the log could have stored and its leaf hash
    is that text's; else VerificationError (the tables were altered behind the log's back).

    Served otherwise, a float would surface as the caller's input error when the document
    is canonicalised, and another spelling, a duplicate key or a field outside the
    allowlist as a proof the offline verifier blames on the proof.
    """
    where = f"the log's entry at leaf_index {stored.leaf_index}"
    entry = strict_json(stored.entry_json, where)
    if not isinstance(entry, dict):
        raise VerificationError(f"{where} is not a JSON object")
    try:
        entry_bytes = stored_entry_bytes(entry)
    except AuditEntryError as exc:
        raise VerificationError(f"{where} is not one the log could have stored: {exc}") from None
    if entry_bytes != stored.entry_json.encode("utf-8"):
        raise VerificationError(f"{where} is not stored in canonical form: its row was altered")
    if leaf_hash(entry_bytes) != stored.leaf_hash:
        raise VerificationError(f"{where} does not match its stored leaf hash: its row was altered")
    return entry


def proof_bytes(document: Mapping[str, Any]) -> bytes:
    """The file form of a proof document: its RFC 8785 bytes and one ``\\n``."""
    return canonical_bytes(document) + b"\n"


def parse_proof(raw: bytes | str) -> dict[str, Any]:
    """Read a proof file strictly: exactly the canonical text ``proof_bytes`` writes.

    Raises VerificationError (strict JSON, as every verifier here reads files; then not an
    object, or not in the canonical form, which would let a byte change pass unseen).
    """
    data = raw.encode("utf-8") if isinstance(raw, str) else bytes(raw)
    if not data.endswith(b"\n"):
        raise VerificationError("proof file must end with one newline")
    document = strict_json(data[:-1], "proof file")
    if not isinstance(document, dict):
        raise VerificationError("proof file is not a JSON object")
    try:
        canonical = proof_bytes(document)
    except AuditEntryError as exc:
        raise VerificationError(f"proof file cannot be canonicalised: {exc}") from None
    if canonical != data:
        raise VerificationError(
            "proof file is not in RFC 8785 canonical form followed by one newline"
        )
    return document


def _hashes(value: Any, field: str) -> list[bytes]:
    if not isinstance(value, list):
        raise VerificationError(f"proof {field} must be a list of base64 hashes")
    if len(value) > MAX_PROOF_HASHES:
        raise VerificationError(f"proof {field} has more than {MAX_PROOF_HASHES} hashes")
    return [
        b64decode_strict(text, f"proof {field}[{position}]", size=HASH_SIZE)
        for position, text in enumerate(value)
    ]


def _section(document: Mapping[str, Any], name: str, keys: frozenset[str]) -> Mapping[str, Any]:
    section = document[name]
    if not isinstance(section, Mapping) or set(section) != keys:
        raise VerificationError(f"proof {name} must be an object with exactly {sorted(keys)}")
    return section


def verify_proof(
    proof: Mapping[str, Any] | bytes | str,
    public_key: Ed25519PublicKey | bytes | str | Sequence[Ed25519PublicKey],
    origin: str,
    *,
    trusted: str | Mapping[str, Any],
    key_history: Any = None,
    rotation_proof: RotationProof = None,
) -> ProofReport:
    """Check a proof document offline; raise VerificationError naming what failed.

    ``public_key`` and ``origin`` are the pinned ones (decision 0063: the document's own
    origin and key ids are compared with them, never believed). ``trusted`` is the
    checkpoint note the reader held before, or a receipt (verified first; its checkpoint
    is the trusted one, and an inclusion section, if any, must be its entry). ``proof`` is
    the parsed document or the file's bytes (read with ``parse_proof``).

    Refuses: a file that is not the canonical document; another format; another origin or
    key; a checkpoint the pinned key did not sign; a trusted note of another log or key; a
    proof from another size than the trusted note's; a trusted tree larger than the new
    one; a consistency proof that does not join the trusted root to the new root (the log
    was rewritten after the trusted checkpoint); an entry or inclusion proof that does not
    lead to the new root. ``key_history`` (``audit.keyring``, naming the pinned key): the
    notes and the document may be signed by any key of that history; a document whose
    checkpoint (size m) its key signed before being rotated out at N > m verifies only
    with ``rotation_proof``, the log's consistency proof from m to N (bug LL).
    """
    keys = trusted_keys(public_key, key_history)
    receipt: Mapping[str, Any] | None = None
    if isinstance(trusted, Mapping):
        from audit.receipts import ROTATION_POINT_CHECKED_BY_CALLER, verify_receipt

        # The consistency proof below, to a checkpoint in its key's range, is the receipt's
        # proof of reaching its key's rotation point (``retired_point_reached``).
        verify_receipt(
            trusted, keys, origin=origin, rotation_proof=ROTATION_POINT_CHECKED_BY_CALLER
        )
        receipt = trusted
        trusted_note = receipt["checkpoint"]
    else:
        trusted_note = trusted
    try:
        # The reader's own note: a forged one only fails the consistency proof below.
        old_size, old_root = verify_checkpoint(
            trusted_note, keys, origin, rotation_proof=HELD_BY_READER
        )
    except VerificationError as exc:
        raise VerificationError(f"trusted checkpoint: {exc.reason}") from None

    document = parse_proof(proof) if isinstance(proof, bytes | str) else proof
    if not isinstance(document, Mapping) or set(document) != PROOF_KEYS:
        raise VerificationError(f"a proof document has exactly the fields {sorted(PROOF_KEYS)}")
    if document["format"] != PROOF_FORMAT:
        raise VerificationError(f"proof format {document['format']!r} is not {PROOF_FORMAT!r}")
    if document["origin"] != origin:
        raise VerificationError(
            f"proof origin {document['origin']!r} is not the pinned origin {origin!r}"
        )
    key = key_by_id(keys, document["key_id"])
    if key is None:
        raise VerificationError("proof key_id is not the pinned public key's id")
    if document["note_key_id"] != note_key_id(origin, key).hex():
        raise VerificationError("proof note_key_id does not match the pinned public key")
    if not isinstance(document["checkpoint"], str):
        raise VerificationError("proof checkpoint is not a signed note")
    try:
        # The key the document names signs its checkpoint, in that key's range (LL).
        tree_size, root = verify_checkpoint(
            document["checkpoint"], keys.only(key), origin, rotation_proof=rotation_proof
        )
    except VerificationError as exc:
        raise VerificationError(f"proof checkpoint: {exc.reason}") from None
    # Where the document's tree is proven to reach: its own size, or its key's rotation
    # point when the rotation proof took it there.
    below = keys.point_below([key], tree_size)
    reached = tree_size if below is None else below[1].tree_size
    if not _is_int(document["tree_size"]) or document["tree_size"] != tree_size:
        raise VerificationError("proof tree_size differs from its signed checkpoint")

    if old_size > tree_size:
        raise VerificationError(
            f"the trusted checkpoint of size {old_size} is larger than the proof's tree of "
            f"size {tree_size}: the log shrank or forked"
        )
    consistency = _section(document, "consistency", CONSISTENCY_KEYS)
    if not _is_int(consistency["old_size"]) or consistency["old_size"] != old_size:
        raise VerificationError(
            f"proof consistency.old_size {consistency['old_size']!r} is not the trusted "
            f"checkpoint's tree size {old_size}"
        )
    hashes = _hashes(consistency["hashes"], "consistency.hashes")
    try:
        verify_consistency(old_size, tree_size, old_root, root, hashes)
    except VerificationError as exc:
        raise VerificationError(
            f"proof consistency: {exc.reason}: the log of size {tree_size} does not extend "
            f"the trusted checkpoint of size {old_size} (rewritten after it was signed, or "
            "the proof was altered)"
        ) from None

    if receipt is not None:
        from audit.receipts import retired_point_reached

        retired_point_reached(keys, receipt["body"]["issuer"]["key_id"], old_size, reached)
    leaf_index = _check_inclusion(document["inclusion"], tree_size, root, receipt)
    return ProofReport(origin, key_id(key), old_size, old_root, tree_size, root, leaf_index)


def _check_inclusion(
    section: Any, tree_size: int, root: bytes, receipt: Mapping[str, Any] | None
) -> int | None:
    if section is None:
        return None
    if not isinstance(section, Mapping) or set(section) != INCLUSION_KEYS:
        raise VerificationError(
            f"proof inclusion must be null or an object with exactly {sorted(INCLUSION_KEYS)}"
        )
    leaf_index = section["leaf_index"]
    if not _is_int(leaf_index) or not 0 <= leaf_index < tree_size:
        raise VerificationError(
            f"proof inclusion.leaf_index must be an integer below the tree size {tree_size}"
        )
    entry = section["entry"]
    if not isinstance(entry, Mapping):
        raise VerificationError("proof inclusion.entry is not a JSON object")
    try:
        entry_bytes = stored_entry_bytes(dict(entry))
    except AuditEntryError as exc:
        raise VerificationError(
            f"proof inclusion.entry is not an entry the log could have stored: {exc}"
        ) from None
    if receipt is not None:
        from audit.receipts import receipt_log_entries

        if leaf_index != receipt["inclusion"]["leaf_index"]:
            raise VerificationError(
                f"proof inclusion.leaf_index {leaf_index} is not the receipt's leaf "
                f"{receipt['inclusion']['leaf_index']}"
            )
        derived = receipt_log_entries(receipt["body"])
        if entry_bytes not in [canonical_bytes(e) for e in derived]:
            raise VerificationError("proof inclusion.entry is not the receipt's log entry")
    hashes = _hashes(section["hashes"], "inclusion.hashes")
    try:
        verify_inclusion(leaf_hash(entry_bytes), leaf_index, tree_size, hashes, root)
    except VerificationError as exc:
        raise VerificationError(
            f"proof inclusion: {exc.reason}: the entry or its proof was altered",
            leaf_index=leaf_index,
        ) from None
    return int(leaf_index)
