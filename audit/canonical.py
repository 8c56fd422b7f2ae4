"""RFC 8785 (JCS) canonical JSON for everything the audit package hashes or signs.

Only JSON's exact types are accepted: strings, booleans, ``None``, integers within
±(2**53 - 1), lists (or tuples) and objects with string keys. Floats are refused
outright: their canonical form is well defined, but values computed on two machines may
differ in the last bit, which would make a verifier's bytes differ from the signer's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import rfc8785

from audit.errors import AuditEntryError

#: RFC 8785 §3.2.2.3 / I-JSON: integers beyond this lose precision in IEEE 754 doubles.
MAX_SAFE_INTEGER = 2**53 - 1


def check_json_value(value: Any, path: str = "$") -> None:
    """Raise AuditEntryError naming the first value that canonical JSON cannot carry exactly."""
    if value is None or isinstance(value, str | bool):
        return
    if isinstance(value, int):
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise AuditEntryError(
                f"{path}: integer {value} is outside ±(2**53 - 1); store it as a string"
            )
        return
    if isinstance(value, float):
        raise AuditEntryError(
            f"{path}: floats are not allowed in audit data ({value!r}); use an integer "
            "(e.g. basis points or milliseconds) or a string"
        )
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_json_value(item, f"{path}[{i}]")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise AuditEntryError(f"{path}: object key {key!r} is not a string")
            check_json_value(item, f"{path}.{key}")
        return
    raise AuditEntryError(f"{path}: {type(value).__name__} is not a JSON type")


def canonical_bytes(obj: Any) -> bytes:
    """Return the RFC 8785 canonical UTF-8 bytes of ``obj``; raise AuditEntryError if impossible."""
    check_json_value(obj)
    try:
        return rfc8785.dumps(obj)
    except rfc8785.CanonicalizationError as exc:  # e.g. lone surrogates in a string
        raise AuditEntryError(f"cannot canonicalise: {exc}") from None
