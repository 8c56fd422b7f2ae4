"""One strict JSON reader for everything a verifier takes from a file it was handed.

Python's ``json`` is lenient where a verifier must not be: it keeps the last of two equal
object keys (so a file can show a human one value and have another verified), it reads
``1.0``, ``1e2``, ``NaN`` and ``Infinity``, and deep nesting ends in ``RecursionError``.
``strict_json`` refuses all of these with a ``VerificationError`` that says what is wrong
(and on which line, when the caller gives one).
"""

from __future__ import annotations

import json
from typing import Any

from audit.errors import VerificationError

#: No artefact of this package nests deeper (a receipt body: 4 levels; an export line: 4).
MAX_DEPTH = 32


class _StrictJSONError(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _StrictJSONError(f"duplicate object key {key!r}")
            seen.add(key)
    return result


def _no_float(text: str) -> Any:
    raise _StrictJSONError(f"non-integer number {text}")


def _depth_exceeds(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def strict_json(text: str | bytes, what: str, *, line_number: int | None = None) -> Any:
    """Parse ``text`` (str, or UTF-8 bytes) strictly; raise VerificationError naming ``what``."""

    def fail(reason: str) -> VerificationError:
        return VerificationError(f"{what} is not valid JSON ({reason})", line_number=line_number)

    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise fail(f"not UTF-8 at byte {exc.start}") from None
    if text.startswith("\ufeff"):
        raise fail("it starts with a byte order mark")
    try:
        value = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_float=_no_float,
            parse_constant=_no_float,
        )
    except RecursionError:
        raise fail(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise fail(str(exc)) from None
    # Cheap bound first: a text with few brackets cannot nest deeply.
    if text.count("[") + text.count("{") > MAX_DEPTH and _depth_exceeds(value, MAX_DEPTH):
        raise fail(f"nested deeper than {MAX_DEPTH} levels")
    return value
