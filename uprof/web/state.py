"""In-memory stores of the web pages: one-time sign-in links and browser sessions.

Links are kept as SHA-256 hashes of their tokens (the token itself exists only in the
answer to the operator who asked for it); a link is single-use and expires. Sessions are
random ids in an HttpOnly, SameSite=Strict cookie; each carries its own CSRF token and is
bound at creation to ONE subject (privacy center) or one operator principal (console).
Both stores live in the server process: a restart signs everybody out and voids links.
Both are bounded (uprof.caching): past MAX_LINKS unredeemed links the oldest is voided,
past MAX_SESSIONS the least recently used session is signed out.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from uprof.caching import BoundedCache

LINK_TTL = timedelta(minutes=15)
SESSION_TTL = timedelta(hours=1)
MAX_LINKS = 10_000
MAX_SESSIONS = 10_000


def _now() -> datetime:
    return datetime.now(tz=UTC)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class _Link:
    subject: str
    expires_at: datetime
    used: bool = False


class LinkStore:
    """Single-use sign-in links for the privacy center, stored by hash."""

    def __init__(self, ttl: timedelta = LINK_TTL, max_links: int = MAX_LINKS) -> None:
        self._ttl = ttl
        self._links: BoundedCache[str, _Link] = BoundedCache(max_links, name="web-links")

    def issue(self, subject: str) -> tuple[str, datetime]:
        token = secrets.token_urlsafe(32)
        expires_at = _now() + self._ttl
        self._links.put(_hash(token), _Link(subject, expires_at))
        return token, expires_at

    def redeem(self, token: str) -> str | None:
        """Return the link's subject and burn the link; None when unknown, used or expired."""
        if not token or len(token) > 200:
            return None
        # Taken out of the store: a burnt link is gone, exactly like an unknown one.
        link = self._links.take(_hash(token))
        if link is None or link.used or link.expires_at <= _now():
            return None
        link.used = True
        return link.subject

    def __len__(self) -> int:
        return len(self._links)


@dataclass
class Session:
    kind: str  # "user" | "operator"
    subject: str = ""  # user sessions: the one subject, fixed at sign-in
    app_id: str = ""  # operator sessions: the key's app
    key_id: str = ""
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    expires_at: datetime = field(default_factory=lambda: _now() + SESSION_TTL)
    #: Erasure receipts issued in this session (privacy center), newest last.
    receipts: list[dict[str, Any]] = field(default_factory=list)

    def csrf_ok(self, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(self.csrf, presented or "")


class SessionStore:
    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self._sessions: BoundedCache[str, Session] = BoundedCache(max_sessions, name="web-sessions")

    def create(self, session: Session) -> str:
        sid = secrets.token_urlsafe(32)
        self._sessions.put(_hash(sid), session)
        return sid

    def get(self, sid: str | None, kind: str) -> Session | None:
        if not sid:
            return None
        session = self._sessions.get(_hash(sid))
        if session is None:
            return None
        if session.expires_at <= _now():
            self._sessions.pop(_hash(sid))
            return None
        return session if session.kind == kind else None

    def drop(self, sid: str | None) -> None:
        if sid:
            self._sessions.pop(_hash(sid))

    def __len__(self) -> int:
        return len(self._sessions)
