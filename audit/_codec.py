"""Strict text encodings: one accepted spelling per value, so no byte of an artefact is slack.

Lenient decoders accept several spellings of the same bytes (base64 padding bits, hex case),
which would let a one-character edit pass verification unnoticed.
"""

from __future__ import annotations

import base64
import binascii
import re

from audit.errors import VerificationError

_HEX_RE = re.compile(r"^[0-9a-f]*\Z")


def b64encode(data: bytes) -> str:
    """Standard base64 with padding (RFC 4648 §4), as C2SP notes use."""
    return base64.b64encode(data).decode("ascii")


def b64decode_strict(text: object, what: str, *, size: int | None = None) -> bytes:
    """Decode base64 only if ``text`` is the canonical encoding; raise VerificationError."""
    if not isinstance(text, str):
        raise VerificationError(f"{what} is not a base64 string")
    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise VerificationError(f"{what} is not valid base64") from None
    if b64encode(data) != text:
        raise VerificationError(f"{what} is not canonical base64")
    if size is not None and len(data) != size:
        raise VerificationError(f"{what} has {len(data)} bytes, expected {size}")
    return data


def hexdecode_strict(text: object, what: str, *, size: int | None = None) -> bytes:
    """Decode lowercase hex only; raise VerificationError otherwise."""
    if not isinstance(text, str) or not _HEX_RE.match(text) or len(text) % 2:
        raise VerificationError(f"{what} is not lowercase hex")
    data = bytes.fromhex(text)
    if size is not None and len(data) != size:
        raise VerificationError(f"{what} has {len(data)} bytes, expected {size}")
    return data
