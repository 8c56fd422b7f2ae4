"""Signed erasure receipts (FIELD-NOTES §5.4, §5.5), verifiable offline with the public key.

A receipt is ``{"body", "body_sig", "inclusion", "checkpoint"}``:

- ``body``: what was erased, how and what may survive (``gov.erasure-receipt/v1``); it names
  the subject only through ``subject_commitment = SHA-256(subject_id || nonce)``.
- ``body_sig``: base64 Ed25519 signature over ``RFC 8785(body)``.
- ``inclusion``: ``{"leaf_index", "tree_size", "hashes"}`` (base64, leaf to root) for the log
  entry that records the receipt.
- ``checkpoint``: the C2SP signed note for ``tree_size``.

The log entry is derived from the body, so a verifier rebuilds it without trusting anything
else: ``{"action": "erasure.receipt", "receipt_id": body.receipt_id, "receipt_sha256":
hex SHA-256(RFC 8785(body)), "recorded_at": body.issued_at}``. The log holds that hash, not the
body (the body may name a tenant and request details that have no place in the shared log).
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from hashlib import sha256
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from audit._codec import b64decode_strict, b64encode, hexdecode_strict
from audit.canonical import canonical_bytes
from audit.checkpoint import verify_checkpoint
from audit.entry import normalise_timestamp, validate_entry
from audit.errors import AuditEntryError, VerificationError
from audit.keyring import key_by_id, trusted_keys
from audit.keys import HELD_BY_READER, RotationProof, TrustedKeys, key_id
from audit.log import AuditLog
from audit.merkle import HASH_SIZE, leaf_hash, verify_inclusion
from audit.strict_json import strict_json

RECEIPT_TYPE = "gov.erasure-receipt/v1"
RECEIPT_ACTION = "erasure.receipt"
RECEIPT_KEYS = frozenset({"body", "body_sig", "inclusion", "checkpoint"})
INCLUSION_KEYS = frozenset({"leaf_index", "tree_size", "hashes"})
REQUEST_KEYS = frozenset({"request_id", "received_at", "basis", "scope"})
SUBJECT_KEYS = frozenset({"tenant", "subject_commitment"})
BODY_KEYS = frozenset(
    {"type", "receipt_id", "issued_at", "issuer", "request", "subject", "actions", "residual"}
)
#: FIELD-NOTES §5.4: the steps of the erasure cascade a receipt may cite.
ACTION_TYPES = frozenset(
    {
        "tombstone_appended",
        "dek_destroyed",
        "projection_purged",
        "embeddings_purged",
        "cache_invalidated",
    }
)
NONCE_BYTES = 32


def new_commitment_nonce() -> bytes:
    """Return a fresh random nonce for ``subject_commitment`` (give it only to the subject)."""
    return secrets.token_bytes(NONCE_BYTES)


def subject_commitment(subject_id: str, nonce: bytes) -> str:
    """Return hex ``SHA-256(subject_id (UTF-8) || nonce)``.

    The nonce is exactly ``NONCE_BYTES`` long, for the issuer and for the verifier alike:
    with no separator between the two parts, a nonce of any other length would let bytes
    move across the boundary, so that the receipt of ``ana1`` (nonce N) also matched ``ana``
    with the nonce ``1 || N``, and every shorter prefix of the subject id likewise (bug IW).
    A fixed length leaves one way to split what was hashed."""
    if not isinstance(nonce, bytes | bytearray) or len(nonce) != NONCE_BYTES:
        raise AuditEntryError(
            f"the commitment nonce must be exactly {NONCE_BYTES} random bytes "
            f"({2 * NONCE_BYTES} hex digits, as given at erasure)"
        )
    try:
        encoded = subject_id.encode("utf-8")
    except (AttributeError, UnicodeEncodeError):
        # A shell hands Python undecodable argument bytes as lone surrogates (bug IZ).
        raise AuditEntryError("the subject id is not UTF-8 text") from None
    return sha256(encoded + nonce).hexdigest()


def receipt_log_entry(body: Mapping[str, Any]) -> dict[str, Any]:
    """Return the audit log entry that records ``body`` (derived, so verifiers can rebuild it).

    It names the body's ``subject.tenant``, so that each tenant's auditors find their own
    receipts (decision 0089-audit-per-tenant); receipts issued before it named none
    (``legacy_receipt_log_entry``)."""
    entry = {**legacy_receipt_log_entry(body), "tenant": body["subject"]["tenant"]}
    validate_entry(entry)
    return entry


def legacy_receipt_log_entry(body: Mapping[str, Any]) -> dict[str, Any]:
    """The entry receipts issued before 2026-12-05 were recorded with: no tenant."""
    entry = {
        "action": RECEIPT_ACTION,
        "receipt_id": body["receipt_id"],
        "receipt_sha256": sha256(canonical_bytes(body)).hexdigest(),
        "recorded_at": body["issued_at"],
    }
    validate_entry(entry)
    return entry


def receipt_log_entries(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The entries a receipt's leaf may hold: the tenant's, then (receipts issued before
    entries named their tenant) the legacy one. Both derive from the signed body alone, so
    accepting either lets nothing but that body's receipt through."""
    legacy = legacy_receipt_log_entry(body)
    try:
        return [receipt_log_entry(body), legacy]
    except AuditEntryError:  # a tenant the log could never have named: only the legacy form
        return [legacy]


def issue_erasure_receipt(
    log: AuditLog,
    *,
    request_id: str,
    received_at: str | datetime,
    basis: str,
    scope: Any,
    tenant: str,
    subject_commitment: str,
    actions: Sequence[Mapping[str, Any]],
    residual: Mapping[str, Any],
    receipt_id: str | None = None,
    issued_at: str | datetime | None = None,
) -> dict[str, Any]:
    """Sign a receipt body, record its hash in the log, checkpoint, and return the receipt.

    ``actions`` are objects with a ``type`` from ``ACTION_TYPES`` plus their details (stream,
    version, notification id, ``dek_commitment``, projection name and tracking position, ...).
    ``residual`` states what may survive (backup retention days, KEK rotation days, a note).
    All values must be canonical-JSON safe (no floats). Raises AuditEntryError otherwise.
    """
    key = log.signing_key()  # the body names the key that signs it
    body = {
        "type": RECEIPT_TYPE,
        "receipt_id": receipt_id or str(uuid.uuid4()),
        "issued_at": normalise_timestamp(issued_at, "issued_at") if issued_at else log.now(),
        "issuer": {"origin": log.origin, "key_id": key_id(key)},
        "request": {
            "request_id": request_id,
            "received_at": normalise_timestamp(received_at, "received_at"),
            "basis": basis,
            "scope": scope,
        },
        "subject": {"tenant": tenant, "subject_commitment": subject_commitment},
        "actions": [dict(action) for action in actions],
        "residual": dict(residual),
    }
    try:
        check_receipt_body(body)  # the same rules verify_receipt applies
    except VerificationError as exc:
        raise AuditEntryError(exc.reason) from None
    body_sig = log.sign_json(body, key=key)  # canonicalising refuses floats and huge integers
    entry = receipt_log_entry(body)
    record = log.append(entry)
    if record.leaf_hash != leaf_hash(canonical_bytes(entry)):  # the log must store it verbatim
        raise VerificationError("the log stored the receipt entry differently from its body")
    checkpoint = log.checkpoint_record(key=key)  # signed by the key the body names
    proof = log.inclusion_proof(record.leaf_index, checkpoint.tree_size)
    return {
        "body": body,
        "body_sig": b64encode(body_sig),
        "inclusion": {
            "leaf_index": record.leaf_index,
            "tree_size": checkpoint.tree_size,
            "hashes": [b64encode(h) for h in proof],
        },
        "checkpoint": checkpoint.note,
    }


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def verify_receipt(
    receipt: Mapping[str, Any],
    public_key: Ed25519PublicKey | bytes | str | Sequence[Ed25519PublicKey],
    *,
    origin: str,
    key_history: Any = None,
    tenant: str | None = None,
    rotation_proof: RotationProof = None,
) -> None:
    """Verify a receipt offline with only the issuer's public key; raise VerificationError.

    Checks the body signature and issuer key id, the checkpoint note, and that the entry
    derived from the body sits at ``inclusion.leaf_index`` of the checkpointed tree, in
    the log named ``origin`` (required, as ``verify_export``'s: a key that signs for two
    logs must not let a receipt of one pass for the other).

    With ``key_history`` (``audit.keyring``; it must name the pinned key), the body and
    checkpoint may be signed by any key of that history: a receipt issued before or after
    an audit key rotation verifies with the first key (or any trusted one). A sequence of
    keys as ``public_key`` is taken as the trusted set itself.
    With ``tenant``, the receipt must be that tenant's (``body.subject.tenant``): tenants
    sharing one set of stores share the log, its key and its origin, so without it a
    receipt of another tenant verifies as well as one's own (bug IX).
    """
    keys = trusted_keys(public_key, key_history)
    if not isinstance(receipt, Mapping) or set(receipt) != RECEIPT_KEYS:
        raise VerificationError(f"a receipt is an object with exactly {sorted(RECEIPT_KEYS)}")
    body = receipt["body"]
    check_receipt_body(body)
    try:
        canonical = canonical_bytes(body)
        entries = receipt_log_entries(body)
    except AuditEntryError as exc:
        raise VerificationError(f"receipt body cannot be canonicalised: {exc}") from None

    # 1. The body signature and the issuer's key id (FIELD-NOTES §5.5 step 1).
    signature = b64decode_strict(receipt["body_sig"], "body_sig", size=64)
    key = key_by_id(keys, body["issuer"]["key_id"])
    if key is None:
        raise VerificationError(
            "issuer.key_id is not the id of the pinned public key"
            + (" nor of a key its history endorses" if len(keys) > 1 or key_history else "")
        )
    try:
        key.verify(signature, canonical)
    except InvalidSignature:
        raise VerificationError("receipt body signature does not verify") from None
    issuer_origin = body["issuer"]["origin"]
    if issuer_origin != origin:
        raise VerificationError(f"receipt was issued by log {issuer_origin!r}, not {origin!r}")
    stated_tenant = body["subject"]["tenant"]
    if tenant is not None and stated_tenant != tenant:
        raise VerificationError(
            f"receipt is of an erasure for tenant {stated_tenant!r}, not {tenant!r}"
        )

    # 2. The checkpoint (step 2).
    if not isinstance(receipt["checkpoint"], str):
        raise VerificationError("receipt checkpoint is not a signed note")
    # A checkpoint below its key's rotation point needs ``rotation_proof`` (bug KG): the
    # rule of every retired key's statement, applied where every verifier applies it.
    tree_size, root = verify_checkpoint(
        receipt["checkpoint"], keys, issuer_origin, rotation_proof=rotation_proof
    )

    # 3. The inclusion of the derived log entry (step 3).
    inclusion = receipt["inclusion"]
    if not isinstance(inclusion, Mapping) or set(inclusion) != INCLUSION_KEYS:
        raise VerificationError(f"receipt inclusion needs exactly {sorted(INCLUSION_KEYS)}")
    leaf_index, size, hashes = inclusion["leaf_index"], inclusion["tree_size"], inclusion["hashes"]
    if not _is_int(leaf_index) or not _is_int(size) or not isinstance(hashes, list):
        raise VerificationError("receipt inclusion has the wrong types")
    if size != tree_size:
        raise VerificationError(
            f"receipt inclusion is for tree size {size}, the checkpoint for {tree_size}"
        )
    proof = [
        b64decode_strict(h, f"inclusion hash {i}", size=HASH_SIZE) for i, h in enumerate(hashes)
    ]
    # The entry names the body's tenant; a receipt issued before entries named one, not.
    failures: list[VerificationError] = []
    for entry in entries:
        try:
            verify_inclusion(leaf_hash(canonical_bytes(entry)), leaf_index, tree_size, proof, root)
            return
        except VerificationError as exc:
            failures.append(exc)
    raise failures[0]


#: ``verify_receipt(..., rotation_proof=ROTATION_POINT_CHECKED_BY_CALLER)``: for
#: ``audit.proofs.verify_proof`` only, whose consistency proof from the receipt's checkpoint
#: to a later one does that check (``retired_point_reached``).
ROTATION_POINT_CHECKED_BY_CALLER: Sequence[str] = HELD_BY_READER


def retired_point_reached(
    keys: TrustedKeys, issuer_key_id: str, receipt_size: int, later_size: int
) -> None:
    """Raise unless a receipt's tree (size ``receipt_size``), proven consistent with a
    later checkpoint of ``later_size`` (verified in range), reaches its issuer key's
    retirement point: that later tree is then vouched for by a key in its range."""
    point = keys.retired_at.get(issuer_key_id)
    if point is not None and receipt_size < point.tree_size > later_size:
        raise VerificationError(
            f"the receipt's key was rotated out at tree size {point.tree_size}, after its "
            f"checkpoint of size {receipt_size}: a proof to size {later_size} does not reach "
            "that point, so the receipt's tree rests on the retired key's word alone"
        )


def verify_subject_commitment(receipt: Mapping[str, Any], subject_id: str, nonce: bytes) -> None:
    """Check that a receipt is about ``subject_id`` (the subject holds the nonce)."""
    try:
        stated = receipt["body"]["subject"]["subject_commitment"]
    except (KeyError, TypeError):
        raise VerificationError("receipt has no subject commitment") from None
    try:
        expected = subject_commitment(subject_id, nonce)
    except AuditEntryError as exc:
        raise VerificationError(f"cannot check the subject: {exc}") from None
    if stated != expected:
        raise VerificationError("the subject commitment does not match this subject and nonce")


def parse_receipt(raw: bytes | str) -> Any:
    """Parse a receipt file strictly: UTF-8 JSON without a BOM, duplicate keys, floats or
    NaN, and no deeper than ``MAX_RECEIPT_DEPTH``; raise VerificationError naming the problem.

    ``json.loads`` keeps the last of two equal keys, so a file could show a reader one list
    of actions and have another verified: such a file is refused, not interpreted.
    """
    return strict_json(raw, "receipt")


def check_receipt_body(body: Any) -> None:
    """Raise VerificationError unless ``body`` has the shape ``issue_erasure_receipt`` gives.

    The issuer checks a body with this before signing it and ``verify_receipt`` checks it
    again, so a receipt signed by the right key but saying nothing verifiable (no action,
    an unknown action, no tombstone, a commitment that is not a hash, a time in another
    form than the log's) is refused like a forged one.
    """
    if not isinstance(body, Mapping) or set(body) != BODY_KEYS:
        raise VerificationError(f"receipt body needs exactly {sorted(BODY_KEYS)}")
    if body["type"] != RECEIPT_TYPE:
        raise VerificationError(f"receipt type {body['type']!r} is not {RECEIPT_TYPE!r}")
    if not isinstance(body["receipt_id"], str) or not body["receipt_id"]:
        raise VerificationError("receipt_id must be a non-empty string")
    _check_time(body["issued_at"], "issued_at")
    issuer = body["issuer"]
    if (
        not isinstance(issuer, Mapping)
        or set(issuer) != {"origin", "key_id"}
        or not isinstance(issuer["origin"], str)
        or not isinstance(issuer["key_id"], str)
    ):
        raise VerificationError("receipt issuer needs string 'origin' and 'key_id'")
    request = body["request"]
    if not isinstance(request, Mapping) or set(request) != REQUEST_KEYS:
        raise VerificationError(f"receipt request needs exactly {sorted(REQUEST_KEYS)}")
    for name in ("request_id", "basis"):
        if not isinstance(request[name], str) or not request[name]:
            raise VerificationError(f"receipt request.{name} must be a non-empty string")
    _check_time(request["received_at"], "request.received_at")
    subject = body["subject"]
    if not isinstance(subject, Mapping) or set(subject) != SUBJECT_KEYS:
        raise VerificationError(f"receipt subject needs exactly {sorted(SUBJECT_KEYS)}")
    if not isinstance(subject["tenant"], str):
        raise VerificationError("receipt subject.tenant must be a string")
    hexdecode_strict(subject["subject_commitment"], "receipt subject.subject_commitment", size=32)
    _check_actions(body["actions"])
    for position, action in enumerate(body["actions"]):
        # A step another request of the same subject did (the later of two erasures at
        # once cites the earlier one's tombstone and key destruction): it names that one.
        if "by_request" in action and (
            not isinstance(action["by_request"], str)
            or not action["by_request"]
            or action["by_request"] == request["request_id"]
        ):
            raise VerificationError(
                f"receipt actions[{position}].by_request must name another request than "
                "request.request_id"
            )
    if not isinstance(body["residual"], Mapping):
        raise VerificationError("receipt residual must be an object")


def _check_actions(actions: Any) -> None:
    if not isinstance(actions, list) or not actions:
        raise VerificationError(
            "receipt actions must be a non-empty list: a receipt that cites no step of the "
            "erasure proves none"
        )
    for position, action in enumerate(actions):
        if not isinstance(action, Mapping) or action.get("type") not in ACTION_TYPES:
            raise VerificationError(
                f"receipt actions[{position}] needs a 'type' among {sorted(ACTION_TYPES)}"
            )
        if action["type"] == "dek_destroyed":
            hexdecode_strict(
                action.get("dek_commitment"), f"receipt actions[{position}].dek_commitment", size=32
            )
    if not any(action["type"] == "tombstone_appended" for action in actions):
        raise VerificationError(
            "receipt actions cite no tombstone_appended: every erasure appends one"
        )


def _check_time(value: Any, what: str) -> None:
    """Times in a body are the log's fixed-width UTC form, so text order is time order."""
    try:
        if isinstance(value, str) and normalise_timestamp(value, what) == value:
            return
    except AuditEntryError:
        pass
    raise VerificationError(f"receipt {what} must be a UTC time like 2025-03-01T08:00:00.000000Z")
