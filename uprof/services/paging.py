"""Keyset pages and the opaque cursors that continue them.

Every list uprof returns (audit entries, receipts, consents, memories, subjects, policy
history) is read a page at a time: ``limit`` items in a fixed order on an immutable key,
plus a ``next_cursor`` when more follow. The next request sends the cursor back.

Why keyset and not offset: a page starts strictly after the last key the previous page
showed, so writes between pages neither repeat an item nor skip one that was there all
along (an offset shifts when rows are added in front of it).

A cursor is ``c1.<position>.<tag>``: the position is the last key shown (base64url JSON of
strings and integers: ids and timestamps the caller has just seen, nothing else), and the
tag is an HMAC-SHA256 over the position *and the listing it was issued for*: the list's
name, the principal it was issued to, the subject it concerns and every filter. The
listing itself is never in the cursor: the server rebuilds it from the request, so a
cursor replayed by another app, for another subject, with other filters, or altered in
any byte, fails the tag check and is refused as a 422 naming ``cursor``. A cursor only
ever moves where a page starts; the filters and the authorization come from the request,
checked again on every page, so no cursor can widen what its bearer may see.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, TypeVar

from domain.errors import InvalidInputError

#: Items per page when the caller names no limit, and the most a caller may ask for.
DEFAULT_PAGE_LIMIT = 100
MAX_PAGE_LIMIT = 500
#: A cursor longer than this is refused before it is decoded (positions are short).
MAX_CURSOR_CHARS = 512
_VERSION = "c1"
_TAG_BYTES = 16

T = TypeVar("T")
Position = tuple[str | int, ...]


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list, and the cursor of the next (None on the last page)."""

    items: tuple[T, ...]
    next_cursor: str | None


@dataclass(frozen=True)
class Listing:
    """What a cursor is bound to: the list, the principal, the subject and the filters.

    ``shape`` names the type of each position field (``"int"``, ``"str"``, ``"time"``),
    so a cursor decodes only into the key its list is ordered by.
    """

    name: str
    principal: str
    shape: tuple[str, ...]
    scope: tuple[tuple[str, str], ...] = ()

    def binding(self) -> bytes:
        fields = {"list": self.name, "principal": self.principal, "scope": dict(self.scope)}
        return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode("utf-8")


def check_limit(limit: int | None) -> int:
    """The page size to use; a limit outside 1..MAX_PAGE_LIMIT is bad input naming ``limit``."""
    if limit is None:
        return DEFAULT_PAGE_LIMIT
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_LIMIT:
        raise InvalidInputError(
            f"limit must be an integer from 1 to {MAX_PAGE_LIMIT}", field="limit"
        )
    return limit


def time_key(value: datetime) -> str:
    """A timestamp as a position field: UTC, microseconds, fixed width (sorts as text)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)  # the views hand SQLite's naive UTC times back
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time_key(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


class CursorCodec:
    """Issue and open cursors under one deployment key (derived from the master secret,
    so every server and worker of a deployment accepts the others' cursors)."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 32:
            raise ValueError("the cursor key must be at least 32 bytes")
        self._key = key

    def _tag(self, listing: Listing, payload: bytes) -> bytes:
        message = b"uprof-cursor/1\x00" + listing.binding() + b"\x00" + payload
        return hmac.new(self._key, message, hashlib.sha256).digest()[:_TAG_BYTES]

    def issue(self, listing: Listing, position: Position) -> str:
        if len(position) != len(listing.shape):
            raise ValueError(f"{listing.name}: a position has {len(listing.shape)} fields")
        payload = json.dumps(list(position), separators=(",", ":")).encode("utf-8")
        tag = self._tag(listing, payload)
        return f"{_VERSION}.{_b64(payload)}.{_b64(tag)}"

    def open(self, listing: Listing, cursor: str | None) -> Position | None:
        """The position a cursor continues from (None: the first page).

        Raises InvalidInputError naming ``cursor`` for anything not issued by this
        deployment for exactly this listing.
        """
        if cursor is None or cursor == "":
            return None
        refused = InvalidInputError(
            "cursor was not issued for this list, principal, subject and filters, or was "
            "altered: send the next_cursor of the previous page with the same filters, "
            "or leave it out to start from the first page",
            field="cursor",
        )
        if not isinstance(cursor, str) or len(cursor) > MAX_CURSOR_CHARS:
            raise refused
        parts = cursor.split(".")
        if len(parts) != 3 or parts[0] != _VERSION:
            raise refused
        try:
            payload, tag = _unb64(parts[1]), _unb64(parts[2])
        except (ValueError, binascii.Error):
            raise refused from None
        if not hmac.compare_digest(tag, self._tag(listing, payload)):
            raise refused
        try:
            fields = json.loads(payload)
        except ValueError:
            raise refused from None
        return _typed(fields, listing.shape, refused)


def paginate(
    codec: CursorCodec,
    listing: Listing,
    rows: Sequence[T],
    limit: int,
    position_of: Callable[[T], Position],
) -> Page[T]:
    """Cut ``rows`` (fetched with ``limit + 1``) into a page and the next page's cursor."""
    shown = tuple(rows[:limit])
    if len(rows) <= limit or not shown:
        return Page(shown, None)
    return Page(shown, codec.issue(listing, position_of(shown[-1])))


def _typed(fields: object, shape: tuple[str, ...], refused: InvalidInputError) -> Position:
    if not isinstance(fields, list) or len(fields) != len(shape):
        raise refused
    out: list[str | int] = []
    for value, kind in zip(fields, shape, strict=True):
        if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            out.append(value)
        elif kind == "str" and isinstance(value, str) and len(value) <= 256:
            out.append(value)
        elif kind == "time" and isinstance(value, str):
            try:
                parse_time_key(value)
            except ValueError:
                raise refused from None
            out.append(value)
        else:
            raise refused
    return tuple(out)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text or any(c not in _B64_CHARS for c in text):
        raise ValueError("not base64url")
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    # Only the canonical spelling: the last character of an unpadded base64 text has
    # spare low bits, and a cursor altered there must not decode to the same bytes.
    if _b64(data) != text:
        raise ValueError("not canonical base64url")
    return data


_B64_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
