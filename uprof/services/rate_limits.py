"""Rate-limit counters in the deployment's database: one allowance for every server
process, kept across restarts (decision 0115-shared-rate-limits).

The limits of ``UPROF_RATE_LIMIT`` (per API key, every surface) and
``UPROF_PRIVACY_RATE_LIMIT`` (per privacy-center session) used to be counted in each
server process's memory (the `limits` library's ``MemoryStorage``): N servers gave a
caller N times the allowance, and a restart a fresh one. They are counted here instead,
in the ``rate_limit_slots`` table of the views store (``views`` branch, both backends).

**The window.** A limit "N per P" holds over a moving window: a hit is allowed only if
fewer than N hits were allowed in the P before it. Each period is cut into
``SLOTS`` slots of P/SLOTS; a row counts the hits of one (bucket, period, slot). A check
counts the current slot and the SLOTS before it, the oldest of which may have begun up to
one slot length more than P ago: hits are never under-counted (no window of length P
ever holds more than N allowed hits), and a refusal may come up to P/SLOTS (1/60 of the
period: a second of a minute, a minute of an hour) earlier than an exact log of every hit
would give. A row per slot bounds the storage per bucket (at most SLOTS + 1 rows per
period, whatever the rate), where a log of hits would grow with the limit.

**Atomic across processes.** A check reads the bucket's rows and adds its hit in one
transaction that holds the bucket's lock: ``Backend.serialised_transaction`` (PostgreSQL:
a transaction-scoped advisory lock on the bucket's hash, so different buckets never wait
on each other; SQLite: ``BEGIN IMMEDIATE``, the database's write lock taken before the
read, so no two processes read the same count, waiting up to the connections' busy
timeout). A refused hit writes nothing; a hit over any one of several limits counts
against none of them.

**Bounded storage.** A row is useless once its slot has left its period's window
(``expires_at``); each check deletes its bucket's useless rows, and once a minute per
process a check deletes every bucket's.

**Fail closed.** When the database cannot answer, the check raises
``RateLimitUnavailableError`` (a 503 at the edges): a request is never let through
uncounted.

Buckets are SHA-256 digests of (namespace, key): the table holds no key id, link id or
cookie, and names no one.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa

from domain.errors import RateLimitUnavailableError
from domain.naming import NAMING_CONVENTION
from uprof.caching import BoundedCache

if TYPE_CHECKING:
    from limits import RateLimitItem

_log = logging.getLogger(__name__)

metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)

rate_limit_slots = sa.Table(
    "rate_limit_slots",
    metadata,
    #: hex SHA-256 of "<namespace>\0<key>" (``bucket_of``).
    sa.Column("bucket", sa.String(64), primary_key=True),
    #: The limit's period in seconds (a minute: 60).
    sa.Column("period_s", sa.Integer, primary_key=True, autoincrement=False),
    #: floor(time / (period_s / SLOTS)): which slot of the period's grid.
    sa.Column("slot", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("hits", sa.Integer, nullable=False),
    #: Unix seconds after which the slot is in no window of its period any more.
    sa.Column("expires_at", sa.BigInteger, nullable=False, index=True),
)

#: Slots per period: the window is exact to 1/SLOTS of the period (on the safe side).
SLOTS = 60
#: Seconds between two deletions of every bucket's expired rows, per process.
PRUNE_EVERY_S = 60.0
#: The high 32 bits of every bucket's advisory lock key on PostgreSQL ("rate"): apart from
#: uprof's other advisory keys (the schema and open locks, the audit append lock).
_LOCK_TAG = 0x72617465
#: How many refused buckets a process remembers (least recently used forgotten first).
REFUSALS_KEPT = 10_000


def bucket_of(namespace: str, key: str) -> str:
    """The bucket of ``key`` in ``namespace`` (a digest: no identifier is stored)."""
    return hashlib.sha256(f"{namespace}\0{key}".encode()).hexdigest()


@dataclass(frozen=True)
class Refusal:
    """A hit refused: the limit it is over, in how many seconds one will be allowed, and
    from when (unix seconds; no process allows one before)."""

    limit: RateLimitItem
    retry_after_s: float
    until: float


class RateCounters:
    """The deployment's rate-limit counters (``rate_limit_slots``)."""

    def __init__(
        self,
        engine: sa.Engine,
        *,
        clock: Callable[[], float] = time.time,
        prune_every_s: float = PRUNE_EVERY_S,
    ) -> None:
        from uprof.backends import backend_for

        self._engine = engine
        self._backend = backend_for(engine)
        self._clock = clock
        self._prune_every_s = prune_every_s
        self._pruned_at = -math.inf
        self._prune_lock = threading.Lock()

    def hit(self, bucket: str, limits: Sequence[RateLimitItem]) -> Refusal | None:
        """Count one hit of ``bucket`` against every one of ``limits``: None if it is
        allowed (and counted), else the refusal with the longest wait (nothing counted).
        Raises ``RateLimitUnavailableError`` if the database does not answer."""
        try:
            refusal = self._hit(bucket, limits)
        except sa.exc.SQLAlchemyError as error:
            raise RateLimitUnavailableError(
                f"the rate-limit counters could not be read ({type(error).__name__})"
            ) from error
        if refusal is None:
            self._prune_now_and_then(self._clock())
        return refusal

    def _hit(self, bucket: str, limits: Sequence[RateLimitItem]) -> Refusal | None:
        table = rate_limit_slots
        lock_key = (_LOCK_TAG << 32) | int(bucket[:8], 16)
        # Counters, not records: a crash of the database server may lose its last few
        # hundred ms of hits, so no commit here waits for a disk flush (PostgreSQL).
        with self._backend.serialised_transaction(self._engine, lock_key, flush=False) as conn:
            now = self._clock()
            rows = conn.execute(
                sa.select(table.c.period_s, table.c.slot, table.c.hits).where(
                    table.c.bucket == bucket
                )
            ).all()
            by_period: dict[int, dict[int, int]] = {}
            for row in rows:
                by_period.setdefault(int(row.period_s), {})[int(row.slot)] = int(row.hits)
            refusals = [
                refusal
                for item in limits
                if (refusal := _over(item, by_period.get(int(item.get_expiry()), {}), now))
            ]
            if refusals:
                return max(refusals, key=lambda r: r.retry_after_s)
            # One statement for every period's slot: INSERT .. ON CONFLICT DO UPDATE.
            periods = sorted({int(item.get_expiry()) for item in limits})
            rows_to_count = [
                {
                    "bucket": bucket,
                    "period_s": period,
                    "slot": _slot(period, now),
                    "hits": 1,
                    "expires_at": _expires_at(period, _slot(period, now)),
                }
                for period in periods
            ]
            conn.execute(
                self._backend.upsert(
                    table,
                    rows_to_count,
                    [table.c.bucket, table.c.period_s, table.c.slot],
                    {"hits": table.c.hits + 1},
                )
            )
            if any(int(row.slot) < _slot(int(row.period_s), now) - SLOTS for row in rows):
                conn.execute(
                    table.delete().where(table.c.bucket == bucket, table.c.expires_at < now)
                )
        return None

    def _prune_now_and_then(self, now: float) -> None:
        """Delete every bucket's expired rows, at most once per ``prune_every_s`` here.
        Housekeeping after a counted hit: a failure is logged and tried again at the next
        turn, never turned into a refusal of the hit."""
        with self._prune_lock:
            if now - self._pruned_at < self._prune_every_s:
                return
            self._pruned_at = now
        try:
            with self._engine.begin() as conn:
                conn.execute(rate_limit_slots.delete().where(rate_limit_slots.c.expires_at < now))
        except sa.exc.SQLAlchemyError as error:
            _log.warning(
                "could not delete expired rate-limit slots (%s); tried again in %.0f s",
                type(error).__name__,
                self._prune_every_s,
            )

    def rows(self) -> int:
        """How many rows the table holds (for tests and benchmarks)."""
        with self._engine.connect() as conn:
            return int(
                conn.execute(sa.select(sa.func.count()).select_from(rate_limit_slots)).scalar_one()
            )


class RateLimiter:
    """Limits per key of one namespace over the deployment's counters.

    The one thing kept in process memory is a refusal: a bucket refused until time T
    cannot be allowed before T by any process (counts only grow, and a slot leaves its
    window at a fixed time), so until T this process refuses it without asking the
    database. A caller hammering over its limit costs one database check per process and
    refusal period, not one per request.
    """

    def __init__(
        self,
        limits: Sequence[RateLimitItem],
        counters: RateCounters,
        namespace: str,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._limits = list(limits)
        self._counters = counters
        self._namespace = namespace
        self._clock = clock
        #: bucket -> the refusal, until its time: refused here without the database.
        self._refused: BoundedCache[str, Refusal] = BoundedCache(
            REFUSALS_KEPT, name="rate-limit refusals"
        )

    def check(self, key: str) -> Refusal | None:
        """Count one hit for ``key``: None if allowed, else the refusal (nothing counted).
        Raises ``RateLimitUnavailableError`` if the counters do not answer."""
        bucket = bucket_of(self._namespace, key)
        known = self._refused.get(bucket)
        if known is not None:
            wait = known.until - self._clock()
            if wait > 0:
                return Refusal(known.limit, wait, known.until)
        refusal = self._counters.hit(bucket, self._limits)
        if refusal is not None:
            self._refused.put(bucket, refusal)
        return refusal


def _slot(period_s: int, now: float) -> int:
    return math.floor(now * SLOTS / period_s)


def _expires_at(period_s: int, slot: int) -> int:
    """When ``slot`` leaves every window of its period: the check at that time counts the
    slots from slot + 1 on."""
    return math.ceil((slot + SLOTS + 1) * period_s / SLOTS)


def _over(item: RateLimitItem, slots: dict[int, int], now: float) -> Refusal | None:
    """The refusal if ``slots`` already hold ``item.amount`` hits in the window at ``now``."""
    period = int(item.get_expiry())
    first = _slot(period, now) - SLOTS
    window = sorted((slot, hits) for slot, hits in slots.items() if slot >= first)
    used = sum(hits for _, hits in window)
    if used < item.amount:
        return None
    # The wait: until enough of the oldest slots have left the window.
    for slot, hits in window:
        used -= hits
        if used < item.amount:
            leaves_at = (slot + SLOTS + 1) * period / SLOTS
            return Refusal(item, max(0.0, leaves_at - now), leaves_at)
    raise AssertionError("unreachable: the window's last slot leaves it")  # pragma: no cover
