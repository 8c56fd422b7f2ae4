"""The web pages' one-time sign-in links and browser sessions.

Links are kept in memory as SHA-256 hashes of their tokens (the token itself exists only
in the answer to the operator who asked for it); a link is single-use and expires, and a
restart voids the links not yet used. Bounded (uprof.caching): past MAX_LINKS unredeemed
links the oldest is voided. A sign-in holds its link from ``redeem`` until it ``spend``s it
(a session, or a decided refusal) or gives it back (stopped before deciding: an outage);
another sign-in meanwhile is told the link is in use, not that it is not valid (bug NW).
A held link is out of the bound's reach (bug PW): only its holder ends the hold.

A session lives in its cookie (HttpOnly, SameSite=Strict), signed with a key derived from
the deployment's master secret in the key folder (itsdangerous, HMAC-SHA256, with the
time it was issued): no server keeps it, so it survives a restart and works on every
server of one deployment. It says what kind it is, binds ONE subject (privacy center) or
one operator key (console), and carries its own CSRF token; a cookie whose signature does
not match, or older than SESSION_TTL, is no session. The signature names the tenant: a
cookie of another tenant on the same stores is no session either. A sign-out is recorded in the data
stores (``SignOutRecord``, the kernel's ``web_sign_outs``): a copy of a signed-out cookie is
refused by every server of the deployment, after restarts too, until it would have expired.
What a server keeps in memory, and loses on a restart: the erasure receipts shown to a
privacy-center session (a subject gets each one as a file when it is issued).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, Protocol

from itsdangerous import BadSignature, URLSafeTimedSerializer

from domain.errors import SignInLinkInUseError
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
    #: The incarnation tag of the subject the link was issued for (``SessionStore.incarnation``).
    incarnation: str = ""
    #: The API key id that asked for the link (it received the token): the link and the
    #: session it opens live only while that key does.
    issued_by: str = ""
    #: Names the link on the audit log (``privacy_link.issued`` beside the issuing key,
    #: and the principal ``privacy-center#<link id>`` of everything its session does).
    #: Random and not a credential: the token is.
    link_id: str = field(default_factory=lambda: secrets.token_hex(8))


class Redeemed(NamedTuple):
    """What a redeemed link said (``LinkStore.redeem``)."""

    subject: str
    incarnation: str
    issued_by: str
    link_id: str
    expires_at: datetime
    #: The link's name in the store (its token's hash), for ``still_live``.
    key: str = ""


class LinkStore:
    """Single-use sign-in links for the privacy center, stored by hash."""

    def __init__(self, ttl: timedelta = LINK_TTL, max_links: int = MAX_LINKS) -> None:
        self._ttl = ttl
        self._links: BoundedCache[str, _Link] = BoundedCache(max_links, name="web-links")
        #: The links a sign-in redeemed and has not finished with (``redeem``): it alone
        #: decides whether the link is spent or given back. Kept apart from ``_links``, out
        #: of the bound's reach: voided by it, a held link was "not valid" to a press beside
        #: it and then put back by ``give_back``, and opened a session (bug PW). As many as
        #: sign-ins under way, each with a link of its own.
        self._held: dict[str, _Link] = {}
        #: The held links whose holder found them live and went on to open a session
        #: (``still_live``): in use until it spends them or gives them back, expired or
        #: not. A press told "not valid" at their expiry was contradicted by the
        #: holder's session a moment later (bug QF).
        self._opening: set[str] = set()
        #: Makes a redeem's look and hold one step: two sign-ins never both hold a link.
        self._lock = threading.Lock()

    def issue(
        self, subject: str, incarnation: str = "", issued_by: str = ""
    ) -> tuple[str, datetime, str]:
        """A new link: its token, when it expires and its id (``_Link.link_id``)."""
        token = secrets.token_urlsafe(32)
        expires_at = _now() + self._ttl
        link = _Link(subject, expires_at, incarnation=incarnation, issued_by=issued_by)
        self._links.put(_hash(token), link)
        return token, expires_at, link.link_id

    def redeem(self, token: str) -> Redeemed | None:
        """Return the link's subject, incarnation tag, issuing key id, link id and expiry,
        and hold the link for this sign-in, which must then ``spend`` it or ``give_back``
        it; None when unknown, spent or expired.

        Raises ``SignInLinkInUseError`` while another sign-in holds it: that sign-in has
        not decided yet, and may still give the link back (an outage), so the link is
        neither valid for this press nor dead (bug NW: it answered "Link not valid")."""
        if not token or len(token) > 200:
            return None
        key = _hash(token)
        with self._lock:
            link = self._held.get(key)
            if link is not None:
                if link.expires_at <= _now() and key not in self._opening:
                    return None  # dead (0186); its holder lets it go (``still_live``)
                raise SignInLinkInUseError(
                    "another sign-in with this link has not finished yet; the link is not "
                    "used up: retry in a few seconds"
                )
            link = self._links.take(key)
            if link is None:
                return None
            if link.expires_at <= _now():
                return None  # expired: gone, exactly like an unknown link
            self._held[key] = link
        return Redeemed(
            link.subject, link.incarnation, link.issued_by, link.link_id, link.expires_at, key
        )

    def still_live(self, redeemed: Redeemed) -> bool:
        """Whether the link ``redeem`` held has not expired since: a sign-in that held it
        while its checks waited asks again before it opens a session. Once expired the
        link is dead for every other press (``redeem``), so it is for its holder too
        (review of 0186 and 0188, bug OX: a link that expired while held still opened a
        session after another press had been told it was not valid). Live, it is the
        holder's to open its session with: another press is told it is in use from then
        on, even once it expires, until the holder spends it or gives it back (bug QF)."""
        with self._lock:
            if redeemed.expires_at <= _now():
                return False
            if redeemed.key in self._held:
                self._opening.add(redeemed.key)
            return True

    def spend(self, token: str) -> None:
        """The sign-in that holds the link decided (it opened a session, or refused the
        link): the link is used up, gone exactly like an unknown one."""
        key = _hash(token)
        with self._lock:
            self._held.pop(key, None)
            self._opening.discard(key)

    def give_back(self, token: str, redeemed: Redeemed) -> None:
        """Release a link ``redeem`` held, unused, with its own expiry: the sign-in could
        not be decided (a store did not answer), so it opened no session, and the link is
        not spent by an outage (review of 0173, bug MG). Only a link this store holds
        is given back: one it no longer holds (spent) is not revived (bug PW: a link the
        bound had voided was put back, after a press was told it was not valid); an
        expired link is not put back."""
        key = _hash(token)
        with self._lock:
            link = self._held.pop(key, None)
            self._opening.discard(key)
            if link is not None and redeemed.expires_at > _now():
                self._links.put(key, link)  # under the bound again, as any unheld link

    def __len__(self) -> int:
        return len(self._links) + len(self._held)


@dataclass
class Session:
    kind: str  # "user" | "operator"
    subject: str = ""  # user sessions: the one subject, fixed at sign-in
    #: User sessions: that subject's incarnation tag at sign-in (``SessionStore.
    #: incarnation``). A name erased and re-created is another subject, with another
    #: pseudonym and so another tag: this session is not its session.
    incarnation: str = ""
    app_id: str = ""  # operator sessions: the key's app
    #: Operator sessions: the key signed in with; user sessions: the key that issued the
    #: link (none on cookies signed before 2026-12-05). Either way the session lives only
    #: while that key does.
    key_id: str = ""
    #: User sessions: the id of the link that opened it (``_Link.link_id``; none on
    #: cookies signed before 2026-12-05): the session acts as ``privacy-center#<link id>``.
    link_id: str = ""
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    #: Names the session (its receipts, its sign-out) without being a credential.
    session_id: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    #: Erasure receipts issued in this session (privacy center), newest last.
    receipts: list[dict[str, Any]] = field(default_factory=list)

    def csrf_ok(self, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(self.csrf, presented or "")


#: Separates these signatures from any other use of the same key.
_SALT = "uprof.web.session/1"
_INCARNATION_SALT = b"uprof.web.incarnation/1"


class SignOutRecord(Protocol):
    """Where sign-outs are kept for every server of the deployment (the kernel's
    ``web_sign_outs``: rows in the data stores)."""

    def sign_out(self, session_id: str, *, until: datetime, now: datetime) -> None: ...

    def is_signed_out(self, session_id: str) -> bool: ...


class SessionStore:
    """Sessions as signed cookie values; see the module docstring for what is kept where."""

    def __init__(
        self,
        secret: bytes,
        *,
        ttl: timedelta = SESSION_TTL,
        max_sessions: int = MAX_SESSIONS,
        sign_outs: SignOutRecord | None = None,
        tenant: str = "default",
    ) -> None:
        """``tenant``: the deployment tenant whose pages the sessions open. Tenants on
        shared stores share the master secret the key is derived from, so the tenant is
        part of the signature: another tenant's cookie is no session here (hostile
        callers round 7, bug HJ). Every tenant's sessions of before that change, the
        default tenant's included, are signed out once (review of 0138, bug HQ)."""
        if len(secret) < 32:
            raise ValueError("the session signing key must be at least 32 bytes")
        # Every tenant, the default one too: before round 7 every tenant signed with the
        # bare salt, so the default tenant keeping it accepted another tenant's cookies
        # of before the upgrade for their hour (review of 0138, bug HQ).
        self._signer = URLSafeTimedSerializer(secret, salt=f"{_SALT}/tenant/{tenant}")
        self._tag_key = hmac.new(secret, _INCARNATION_SALT, hashlib.sha256).digest()
        self._ttl = ttl
        self._receipts: BoundedCache[str, list[dict[str, Any]]] = BoundedCache(
            max_sessions, name="web-session-receipts"
        )
        #: Sign-outs seen by this server (a cookie once refused stays refused without
        #: asking the record again); the record itself holds them for every server.
        self._signed_out: BoundedCache[str, bool] = BoundedCache(
            max_sessions, name="web-signed-out"
        )
        self._sign_outs = sign_outs

    def incarnation(self, pseudonym: str) -> str:
        """A tag of one incarnation of a subject's name: a keyed hash of its pseudonym.

        A cookie is signed, not encrypted: its holder can read it. The pseudonym itself
        would link the name in the cookie to the subject's audit entries, which nothing
        may do once the subject is erased (docs/governance.md); the tag tells only
        whether the name still stands for the same subject."""
        return hmac.new(self._tag_key, pseudonym.encode(), hashlib.sha256).hexdigest()[:32]

    def create(self, session: Session) -> str:
        """Return the cookie value for a new session."""
        return str(
            self._signer.dumps(
                {
                    "kind": session.kind,
                    "subject": session.subject,
                    "incarnation": session.incarnation,
                    "app_id": session.app_id,
                    "key_id": session.key_id,
                    "link_id": session.link_id,
                    "csrf": session.csrf,
                    "session_id": session.session_id,
                }
            )
        )

    def get(self, cookie: str | None, kind: str) -> Session | None:
        """The session a cookie holds; None when absent, forged, expired, signed out or of
        another kind."""
        if not cookie or len(cookie) > 4096:
            return None
        try:
            fields = self._signer.loads(cookie, max_age=int(self._ttl.total_seconds()))
        except BadSignature:  # also SignatureExpired, a subclass
            return None
        if not isinstance(fields, dict) or fields.get("kind") != kind:
            return None
        try:
            session = Session(
                kind=kind,
                subject=str(fields["subject"]),
                # A cookie signed before sessions carried it names no incarnation.
                incarnation=str(fields.get("incarnation", "")),
                app_id=str(fields["app_id"]),
                key_id=str(fields["key_id"]),
                link_id=str(fields.get("link_id", "")),
                csrf=str(fields["csrf"]),
                session_id=str(fields["session_id"]),
            )
        except KeyError:
            return None
        if self._signed_out.get(session.session_id):
            return None
        if self._sign_outs is not None and self._sign_outs.is_signed_out(session.session_id):
            self._signed_out.put(session.session_id, True)
            return None
        receipts = self._receipts.get(session.session_id)
        if receipts is None:
            receipts = []
            self._receipts.put(session.session_id, receipts)
        session.receipts = receipts
        return session

    def drop(self, cookie: str | None, kind: str) -> None:
        """Sign a session out: its cookie is refused from now on, by every server of the
        deployment that shares the record (and by this one in any case)."""
        session = self.get(cookie, kind)
        if session is not None:
            if self._sign_outs is not None:
                now = _now()
                self._sign_outs.sign_out(session.session_id, until=now + self._ttl, now=now)
            self._signed_out.put(session.session_id, True)
            self._receipts.pop(session.session_id)

    def __len__(self) -> int:
        return len(self._receipts)
