"""Canonical JSON and the entry allowlist."""

from __future__ import annotations

import json

import pytest
import rfc8785

from audit.canonical import MAX_SAFE_INTEGER, canonical_bytes
from audit.entry import ENTRY_FIELDS, normalise_timestamp, validate_entry
from audit.errors import AuditEntryError
from domain.errors import InvalidInputError


def test_canonical_bytes_are_rfc8785() -> None:
    obj = {"b": [1, True, None, "é"], "a": {"z": -5, "\u00e9": "x"}, "€": "y", "\U0001f600": 1}
    assert canonical_bytes(obj) == rfc8785.dumps(obj)
    assert canonical_bytes({"b": 1, "a": 2}) == b'{"a":2,"b":1}'


@pytest.mark.parametrize("value", [1.5, 0.0, float("nan"), {"x": [2.0]}, 2**53, -(2**53), b"x"])
def test_floats_huge_integers_and_non_json_types_are_refused(value: object) -> None:
    with pytest.raises(AuditEntryError) as caught:
        canonical_bytes({"v": value})
    assert "$.v" in str(caught.value)
    assert isinstance(caught.value, InvalidInputError)


def test_safe_integer_bounds_are_accepted() -> None:
    assert canonical_bytes([MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER]) == (
        b"[9007199254740991,-9007199254740991]"
    )


def test_non_string_keys_and_lone_surrogates_are_refused() -> None:
    with pytest.raises(AuditEntryError, match="not a string"):
        canonical_bytes({1: "x"})
    with pytest.raises(AuditEntryError):
        canonical_bytes({"x": "\ud800"})


def test_allowlisted_entry_passes() -> None:
    validate_entry(
        {
            "action": "AccessDecision",
            "app_id": "app:planner",
            "agent_id": "agent-7",
            "subject_ref": "sub_3f2a9c",
            "purpose": "personalization",
            "categories": ["diet"],
            "item_refs": ["sha256:" + "ab" * 32],
            "decision": "allow",
            "rule": ["app:planner", "acme", "diet", "read"],
            "counts": {"items": 3},
            "dek_commitment": "0" * 64,
            "dek_commitments": ["0" * 64, "f" * 64],
            "key_version": 2,
            "recorded_at": "2025-01-01T00:00:00Z",
        }
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({}, "missing the required field 'action'"),
        ({"action": "x", "email": "a@b.c"}, "not in the allowlist"),
        ({"action": "x", "user_input": "I live in Lisbon"}, "not in the allowlist"),
        ({"action": "x", "subject_ref": "jane@example.org"}, "subject_ref"),
        ({"action": "x", "subject_ref": "Jane Doe"}, "subject_ref"),
        ({"action": "x", "app_id": "+15551234567"}, "app_id"),
        ({"action": "x", "categories": "diet"}, "categories"),
        ({"action": "x", "counts": {"n": -1}}, "counts.n"),
        ({"action": "x", "counts": {"n": 1.5}}, "counts.n"),
        ({"action": "x", "key_version": True}, "key_version"),
        ({"action": "x", "dek_commitment": "AB" * 32}, "dek_commitment"),
        ({"action": "x", "dek_commitments": "ab" * 32}, "dek_commitments"),
        ({"action": "x", "dek_commitments": []}, "dek_commitments"),
        ({"action": "x", "dek_commitments": ["ab" * 32] * 1001}, "dek_commitments"),
        ({"action": "x", "dek_commitments": ["ab" * 32, "Jane"]}, r"dek_commitments\[1\]"),
        ({"action": "x", "recorded_at": "2025-01-01 00:00"}, "RFC 3339"),
        ({"action": "x", "recorded_at": "2025-01-01T00:00:00"}, "RFC 3339"),
        ({"action": "two words"}, "action"),
        ({"action": 5}, "action"),
    ],
)
def test_entries_outside_the_allowlist_are_refused(entry: dict[str, object], message: str) -> None:
    with pytest.raises(AuditEntryError, match=message):
        validate_entry(entry)


def test_every_allowlisted_field_has_a_validator() -> None:
    assert "action" in ENTRY_FIELDS
    assert all(callable(v) for v in ENTRY_FIELDS.values())
    # No field that would invite free text about a person.
    assert not {"name", "email", "text", "content", "user_input", "reason", "note"} & set(
        ENTRY_FIELDS
    )


def test_timestamps_normalise_to_fixed_width_utc() -> None:
    assert normalise_timestamp("2025-03-01T10:00:00+02:00") == "2025-03-01T08:00:00.000000Z"
    assert normalise_timestamp("2025-03-01T08:00:00.123456789Z") == "2025-03-01T08:00:00.123456Z"
    assert normalise_timestamp("2025-03-01t08:00:00z") == "2025-03-01T08:00:00.000000Z"
    assert (
        json.dumps(normalise_timestamp("0999-01-01T00:00:00Z")) == '"0999-01-01T00:00:00.000000Z"'
    )
