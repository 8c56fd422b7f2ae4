"""What an audit entry may contain: an allowlist of non-personal fields, each with a shape.

The audit log outlives erasure, so it must never hold personal plaintext (FIELD-NOTES §4,
INVARIANTS I10): only pseudonymous references, ids, hashes/commitments, codes and counts.
Every key must be in ``ENTRY_FIELDS``; identifier-like values must be *tokens* (letters, digits
and ``_ . : / * # = -``, no whitespace and no ``@``), which keeps names, sentences, e-mail
addresses and phone numbers (``+``) out by construction. A new field is added here, with its
shape, and documented in docs/audit-format.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from audit.canonical import MAX_SAFE_INTEGER
from audit.errors import AuditEntryError

_TOKEN_RE = re.compile(r"^[A-Za-z0-9_.:/*#=\-]{1,200}\Z")
_ACTION_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.:\-]{0,99}\Z")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}\Z")
#: The longest list an entry holds (item references of a read, among others): a slice
#: never packs more items than its read's entry can list (uprof.retrieval.slices).
MAX_LIST = 1000

Validator = Callable[[str, Any], None]


def _fail(path: str, expected: str, value: Any) -> AuditEntryError:
    shown = value if isinstance(value, int | bool) or value is None else type(value).__name__
    return AuditEntryError(f"audit entry field {path} must be {expected} (got {shown})")


def _token(path: str, value: Any) -> None:
    if not isinstance(value, str) or not _TOKEN_RE.match(value):
        raise _fail(path, "a token of 1-200 letters, digits or _.:/*#=- (no spaces, no @)", value)


def _action(path: str, value: Any) -> None:
    if not isinstance(value, str) or not _ACTION_RE.match(value):
        raise _fail(path, "an action name such as 'consent.granted' or 'AccessDecision'", value)


def _hex64(path: str, value: Any) -> None:
    if not isinstance(value, str) or not _HEX64_RE.match(value):
        raise _fail(path, "64 lowercase hex digits (a SHA-256)", value)


def _count(path: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(path, "an integer", value)
    if not 0 <= value <= MAX_SAFE_INTEGER:
        raise _fail(path, "an integer in 0..2**53-1", value)


def _flag(path: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise _fail(path, "a boolean", value)


def _timestamp(path: str, value: Any) -> None:
    if not isinstance(value, str):
        raise _fail(path, "an RFC 3339 timestamp string", value)
    parse_timestamp(value, path)


def _token_list(path: str, value: Any) -> None:
    if not isinstance(value, list | tuple) or len(value) > MAX_LIST:
        raise _fail(path, f"a list of at most {MAX_LIST} tokens", value)
    for i, item in enumerate(value):
        _token(f"{path}[{i}]", item)


def _hex64_list(path: str, value: Any) -> None:
    if not isinstance(value, list | tuple) or not 1 <= len(value) <= MAX_LIST:
        raise _fail(path, f"a list of 1 to {MAX_LIST} SHA-256s (64 lowercase hex digits)", value)
    for i, item in enumerate(value):
        _hex64(f"{path}[{i}]", item)


def _token_or_token_list(path: str, value: Any) -> None:
    if isinstance(value, str):
        _token(path, value)
    else:
        _token_list(path, value)


def _counts(path: str, value: Any) -> None:
    if not isinstance(value, Mapping) or len(value) > MAX_LIST:
        raise _fail(path, "an object of token -> non-negative integer", value)
    for key, item in value.items():
        _token(f"{path} key", key)
        _count(f"{path}.{key}", item)


#: The allowlist: field -> validator. Values are non-personal by shape.
ENTRY_FIELDS: dict[str, Validator] = {
    # what happened and when
    "action": _action,
    "recorded_at": _timestamp,
    "occurred_at": _timestamp,
    "request_id": _token,
    "reason_code": _token,
    "decision": _token,
    "rule": _token_or_token_list,
    "status": _token,
    "outcome": _token,
    "counts": _counts,
    # who, pseudonymously
    "tenant": _token,
    "principal": _token,
    "app_id": _token,
    "agent_id": _token,
    "agent_type": _token,
    "subject_ref": _token,
    "stream_id": _token,
    # governance vocabulary (closed catalogues)
    "purpose": _token,
    "categories": _token_list,
    "purposes": _token_list,
    "legal_basis": _token,
    "policy_version": _token,
    "policy_sha256": _hex64,
    # who asked for a change (a principal label such as operator:local#cli) and what it was
    "requested_by": _token,
    "change": _token,
    "consent_id": _token,
    "notice_id": _token,
    "notice_sha256": _hex64,
    # references to data, never the data
    "item_refs": _token_list,
    "event_ids": _token_list,
    "notification_id": _count,
    "stream_version": _count,
    "projection": _token,
    "tracking_position": _count,
    # keys and erasure
    "key_version": _count,
    "kek_id": _token,
    "dek_commitment": _hex64,
    # a request's capture keys, recorded in one entry (decision 0072)
    "dek_commitments": _hex64_list,
    "receipt_id": _token,
    "receipt_sha256": _hex64,
    "tree_size": _count,
    # audit signing key rotation: the ids (hex SHA-256 of the public keys) and the new
    # key's position in the key history (audit.keyring)
    "audit_key_id": _hex64,
    "previous_audit_key_id": _hex64,
    "audit_key_seq": _count,
    # API keys: the public id (never the secret) and the roles a key was issued with
    "api_key_id": _token,
    "roles": _token_list,
    # privacy-center sign-in links: the link's random id (never its token)
    "link_id": _token,
    # free-form but non-personal switches
    "explicit": _flag,
    "special_category": _flag,
}

REQUIRED_FIELDS = ("action",)


def validate_entry(entry: Mapping[str, Any]) -> None:
    """Raise AuditEntryError unless ``entry`` uses only allowlisted fields of the right shape."""
    if not isinstance(entry, Mapping):
        raise AuditEntryError(f"an audit entry must be a JSON object, got {type(entry).__name__}")
    for name in REQUIRED_FIELDS:
        if name not in entry:
            raise AuditEntryError(f"audit entry is missing the required field {name!r}")
    if not entry.keys() <= ENTRY_FIELDS.keys():
        unknown = sorted(str(k) for k in entry if k not in ENTRY_FIELDS)
        raise AuditEntryError(
            f"audit entry fields {unknown} are not in the allowlist; allowed: "
            f"{', '.join(sorted(ENTRY_FIELDS))}"
        )
    for name, value in entry.items():
        ENTRY_FIELDS[name](name, value)


def stored_entry_bytes(entry: Any) -> bytes:
    """Return the canonical bytes of ``entry`` if the log could have stored it; else raise.

    What ``AuditLog.append`` stores: an entry ``validate_entry`` accepts, with ``recorded_at``
    present in the log's fixed-width UTC form, as RFC 8785 bytes. A verifier holds every
    entry of an export to this, so a trail the log could not have written (a field outside
    the allowlist, personal text, a time that sorts wrongly as text) is refused even when
    the key that signed it is the right one.
    """
    validate_entry(entry)
    recorded_at = entry.get("recorded_at")
    # ``validate_entry`` read it as a valid RFC 3339 time: in the log's form is then this
    # pattern, the one ``format_timestamp`` writes (``normalise_timestamp`` would give it back
    # unchanged; it parsed the time a second time to say so).
    if not isinstance(recorded_at, str) or not _LOG_FORM_RE.match(recorded_at):
        raise AuditEntryError(
            "audit entry field recorded_at must be present, in the log's UTC form "
            "2025-03-01T08:00:00.000000Z"
        )
    # A valid entry holds only ASCII keys and strings without quotes, backslashes or
    # control characters, integers within 2**53, booleans, lists and objects: for such a
    # value RFC 8785 is exactly sorted, compact json.dumps, 3x faster than rfc8785.dumps
    # (tests/audit/test_verifier_attacks.py checks the two agree on generated entries).
    return _CANONICAL_ENCODER.encode(entry).encode("ascii")


#: ``json.dumps(sort_keys=True, separators=(",", ":"))`` without making an encoder per call.
_CANONICAL_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


# --- Timestamps --------------------------------------------------------------------------------

#: The log's form of a time (``format_timestamp``): fixed-width UTC with microseconds.
_LOG_FORM_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z\Z")
_RFC3339_RE = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})\Z"
)


def parse_timestamp(value: str, what: str = "timestamp") -> datetime:
    """Parse an RFC 3339 timestamp with an explicit offset; raise AuditEntryError otherwise."""
    if not _RFC3339_RE.match(value):
        raise AuditEntryError(f"{what} {value!r} is not an RFC 3339 timestamp with an offset")
    text = value.upper().replace("Z", "+00:00")
    head, _, rest = text.partition(".")
    if rest:  # Python accepts at most 6 fractional digits; truncate nanoseconds
        digits = rest[: len(rest) - 6]
        text = f"{head}.{digits[:6]}{rest[len(rest) - 6 :]}"
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise AuditEntryError(f"{what} {value!r} is not a valid date and time") from None


def format_timestamp(moment: datetime) -> str:
    """Format as fixed-width UTC RFC 3339 with microseconds, so text order is time order."""
    if moment.tzinfo is None:
        raise AuditEntryError("timestamps must be timezone-aware")
    utc = moment.astimezone(UTC)
    return (
        f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}T{utc.hour:02d}:{utc.minute:02d}:"
        f"{utc.second:02d}.{utc.microsecond:06d}Z"
    )


def normalise_timestamp(value: str | datetime, what: str = "timestamp") -> str:
    """Return ``value`` (RFC 3339 text or aware datetime) in the log's fixed UTC format."""
    moment = value if isinstance(value, datetime) else parse_timestamp(value, what)
    return format_timestamp(moment)
