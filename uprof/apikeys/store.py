"""API keys: how an app proves who it is to the REST API and the MCP server.

A key reads ``upk_<key_id>_<secret>``: ``key_id`` (16 hex characters) finds the row,
``secret`` (32 random bytes, URL-safe base64) is checked against a SHA-256 of
``key_id:secret``. The plaintext is shown once, at creation, and never stored.
The app identity of every request is the ``app_id`` of the key's row (I3).

Roles say which surfaces a key may use, not what data it may read (that is the
Casbin policy and the subject's consent, decided in the kernel):

- ``app``: capture, proposals, slices, consents, sessions and identifiers;
- ``operator``: also the full, ungated profile and evidence views (what
  ``uprof profile show`` gives a shell user on the host).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa

from domain.errors import InvalidInputError
from domain.principal import reserved_app_id_problem
from policies.rules import app_id_problem
from uprof.apikeys.tables import api_keys
from uprof.caching import BoundedCache
from uprof.settings import Settings

ROLE_APP = "app"
ROLE_OPERATOR = "operator"
KNOWN_ROLES: tuple[str, ...] = (ROLE_APP, ROLE_OPERATOR)
KEY_PREFIX = "upk"
_KEY_RE = re.compile(r"^upk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True)
class Principal:
    """Who a request comes from, as its API key says."""

    app_id: str
    key_id: str
    roles: frozenset[str]

    def has_role(self, role: str) -> bool:
        return role in self.roles


@dataclass(frozen=True)
class ApiKeyInfo:
    """A key's row without its hash (for listings)."""

    key_id: str
    app_id: str
    roles: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None


@dataclass(frozen=True)
class IssuedKey:
    """A freshly created key; ``token`` is the only time the plaintext exists."""

    info: ApiKeyInfo
    token: str


class NeedsRead:
    """``authenticate_cached``'s answer when only a database read can decide."""


NEEDS_READ = NeedsRead()


def _parse(token: str | None) -> tuple[str, str] | None:
    """(key id, secret) of a well-formed key, else None."""
    if not token:
        return None
    match = _KEY_RE.fullmatch(token.strip())
    if match is None:
        return None
    key_id, secret = match.groups()
    return key_id, secret


def _digest(key_id: str, secret: str) -> str:
    return hashlib.sha256(f"{key_id}:{secret}".encode()).hexdigest()


def _aware(value: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; every stored time is UTC.
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def check_roles(roles: Iterable[str]) -> tuple[str, ...]:
    cleaned = tuple(sorted({r.strip() for r in roles if r.strip()}))
    unknown = [r for r in cleaned if r not in KNOWN_ROLES]
    if unknown or not cleaned:
        raise InvalidInputError(
            f"roles must be a non-empty subset of {', '.join(KNOWN_ROLES)}; got {list(roles)!r}"
        )
    return cleaned


#: How long a key row read for one request may serve the next ones. A revocation made
#: through this store takes effect at once; one made by another process (``uprof apps
#: revoke`` beside a running server) within this many seconds.
KEY_CACHE_TTL_S = 2.0
#: Live key rows kept (bounded: memory stays flat whatever keys are presented).
MAX_CACHED_KEYS = 10_000
#: How long a read of the key table waits for a lock another session holds on it
#: (PostgreSQL: ``ACCESS EXCLUSIVE`` from a migration, a ``VACUUM FULL``, an operator's
#: ``LOCK TABLE``) before it fails as an outage (503, nothing written). Without it every
#: request whose key row had aged waited for as long as the lock was held, at its
#: authentication, before any bound (bug WK). The same order as the checks' bound under
#: the write locks (``domain.under_lock.CHECK_UNDER_LOCK_WITHIN_S``), and shorter, so
#: that a check asked there ends with an answer rather than being left running.
KEY_READ_LOCK_WAIT_S = 1.5


@dataclass(frozen=True)
class _KeyRow:
    app_id: str
    key_hash: str
    roles: frozenset[str]
    read_at: float


class ApiKeyStore:
    """Issue, list, revoke and check API keys in the ``api_keys`` table."""

    def __init__(
        self,
        engine: sa.Engine,
        *,
        tenant: str = "default",
        now: Callable[[], datetime] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``tenant``: the deployment tenant (``Settings.tenant``) whose keys this store
        issues, lists, revokes and accepts; another tenant's key is unknown here."""
        self._engine = engine
        self._tenant = tenant
        self._now = now or (lambda: datetime.now(tz=UTC))
        #: The clock the row cache ages by (a test advances it instead of sleeping).
        self._monotonic = monotonic
        #: key_id -> its live row, as read recently (only live keys are kept).
        self._rows: BoundedCache[str, _KeyRow] = BoundedCache(MAX_CACHED_KEYS, name="api-keys")

    @classmethod
    def open(cls, settings: Settings) -> ApiKeyStore:
        """Open the store beside the key store of a deployment and make sure its table exists.

        Builds its own engine (the kernel does not expose one); ``close`` disposes it.
        """
        from uprof.storage import create_engine, layout_for

        store = cls(create_engine(layout_for(settings).keys_url), tenant=settings.tenant)
        store.ensure_schema()
        return store

    def ensure_schema(self) -> None:
        """Bring the key-store database (which holds the api_keys table) to its newest revision."""
        from uprof.storage import migrate

        migrate(self._engine, "keys")

    def close(self) -> None:
        self._engine.dispose()

    # ---------------------------------------------------------------- commands

    def create(self, app_id: str, roles: Iterable[str] = (ROLE_APP,)) -> IssuedKey:
        """Issue a key for an app; the returned token is shown once and never stored."""
        problem = app_id_problem(app_id)
        if problem:
            raise InvalidInputError(f"app_id: {problem}")
        # "operators" is the policy's name for operators: a key of an app so named would
        # be decided with the operators' rows (erase, export, audit) without the operator
        # role. The other reserved names would pass the app off as someone else in the
        # audit trail.
        reserved = reserved_app_id_problem(app_id)
        if reserved:
            raise InvalidInputError(reserved)
        clean_roles = check_roles(roles)
        key_id = secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        created_at = self._now()
        with self._engine.begin() as conn:
            conn.execute(
                api_keys.insert().values(
                    key_id=key_id,
                    app_id=app_id,
                    key_hash=_digest(key_id, secret),
                    created_at=created_at,
                    revoked_at=None,
                    roles=" ".join(clean_roles),
                    tenant=self._tenant,
                )
            )
        info = ApiKeyInfo(key_id, app_id, clean_roles, created_at, None)
        return IssuedKey(info, f"{KEY_PREFIX}_{key_id}_{secret}")

    def revoke(self, key_id: str) -> bool:
        """Revoke a key; returns False when no live key has that id."""
        with self._engine.begin() as conn:
            result = conn.execute(
                api_keys.update()
                .where(api_keys.c.key_id == key_id, api_keys.c.revoked_at.is_(None), self._ours())
                .values(revoked_at=self._now())
            )
        self._rows.pop(key_id)  # also refuses a fill in flight that read the row before
        return result.rowcount == 1

    # ----------------------------------------------------------------- queries

    def live_app_of(self, key_id: str) -> str | None:
        """The app of the live key ``key_id`` (read now, not from the cache), or None."""
        with self._reading() as conn:
            found = conn.execute(
                sa.select(api_keys.c.app_id).where(
                    api_keys.c.key_id == key_id, api_keys.c.revoked_at.is_(None), self._ours()
                )
            ).first()
        return None if found is None else str(found.app_id)

    def revoked_app_of(self, key_id: str) -> str | None:
        """The app of the revoked key ``key_id`` of this tenant, or None (live or unknown)."""
        with self._reading() as conn:
            found = conn.execute(
                sa.select(api_keys.c.app_id).where(
                    api_keys.c.key_id == key_id, api_keys.c.revoked_at.is_not(None), self._ours()
                )
            ).first()
        return None if found is None else str(found.app_id)

    def list(self, app_id: str | None = None) -> list[ApiKeyInfo]:
        query = sa.select(
            api_keys.c.key_id,
            api_keys.c.app_id,
            api_keys.c.roles,
            api_keys.c.created_at,
            api_keys.c.revoked_at,
        ).where(self._ours())
        query = query.order_by(api_keys.c.created_at, api_keys.c.key_id)
        if app_id is not None:
            query = query.where(api_keys.c.app_id == app_id)
        with self._reading() as conn:
            rows = conn.execute(query).all()
        return [
            ApiKeyInfo(
                r.key_id,
                r.app_id,
                tuple(r.roles.split()),
                _aware(r.created_at),  # type: ignore[arg-type]
                _aware(r.revoked_at),
            )
            for r in rows
        ]

    def authenticate(self, token: str | None) -> Principal | None:
        """Return the principal a presented key stands for, or None (unknown, bad, revoked)."""
        parsed = _parse(token)
        if parsed is None:
            return None
        return self._check(*parsed, self._live_row(parsed[0]))

    def is_live(self, key_id: str) -> bool:
        """Whether the key ``key_id`` is live (a read at most KEY_CACHE_TTL_S old), for a
        session that signed in with it and no longer holds its secret."""
        return self._live_row(key_id) is not None

    def authenticate_cached(self, token: str | None) -> Principal | NeedsRead | None:
        """``authenticate`` without touching the database: ``NEEDS_READ`` when the
        answer needs the key's row and no fresh copy is kept (then call
        ``authenticate``). Lets an event loop answer most requests without blocking
        on a query; the outcome is the same as ``authenticate``'s."""
        parsed = _parse(token)
        if parsed is None:
            return None
        row = self._fresh_row(parsed[0])
        if row is None:
            return NEEDS_READ
        return self._check(*parsed, row)

    def _check(self, key_id: str, secret: str, row: _KeyRow | None) -> Principal | None:
        # Compare even when the row is missing, so timing does not tell which ids exist.
        expected = row.key_hash if row is not None else "0" * 64
        if not hmac.compare_digest(expected, _digest(key_id, secret)):
            return None
        if row is None or reserved_app_id_problem(row.app_id):
            return None  # a key issued under a reserved name before it was refused
        return Principal(row.app_id, key_id, row.roles)

    def _fresh_row(self, key_id: str) -> _KeyRow | None:
        """The key's kept row if it was read at most KEY_CACHE_TTL_S ago, else None."""
        cached = self._rows.get(key_id)
        if cached is not None and self._monotonic() - cached.read_at <= KEY_CACHE_TTL_S:
            return cached
        return None

    def _live_row(self, key_id: str) -> _KeyRow | None:
        """The key's row if it is live, from a read at most KEY_CACHE_TTL_S old."""
        cached = self._fresh_row(key_id)
        if cached is not None:
            return cached
        now = self._monotonic()
        ticket = self._rows.ticket()
        with self._reading() as conn:
            found = conn.execute(
                sa.select(
                    api_keys.c.app_id, api_keys.c.key_hash, api_keys.c.roles, api_keys.c.revoked_at
                ).where(api_keys.c.key_id == key_id, self._ours())
            ).first()
        if found is None or found.revoked_at is not None:
            self._rows.take(key_id)
            return None
        row = _KeyRow(found.app_id, found.key_hash, frozenset(found.roles.split()), now)
        self._rows.put(key_id, row, ticket=ticket)
        return row

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sa.Connection]:
        """A connection for the reads of the key table, whose wait for another session's
        lock is bounded (``KEY_READ_LOCK_WAIT_S``). SQLite's key store is in WAL mode:
        a read never waits for a writer there."""
        from uprof.backends import backend_for

        with self._engine.connect() as conn:
            backend_for(conn).bound_lock_waits(conn, KEY_READ_LOCK_WAIT_S)
            yield conn

    def _ours(self) -> sa.ColumnElement[bool]:
        """Rows of this store's tenant (and keys issued before keys named one)."""
        return sa.or_(api_keys.c.tenant == self._tenant, api_keys.c.tenant.is_(None))

    def ping(self) -> bool:
        """True when the table's database answers (readiness)."""
        try:
            with self._engine.connect() as conn:
                conn.execute(sa.select(sa.func.count()).select_from(api_keys))
        except sa.exc.SQLAlchemyError:
            return False
        return True
