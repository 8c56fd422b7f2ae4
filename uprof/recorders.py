"""Process recorders whose tracking save commits only from the position it started at.

eventsourcing 9.5's single-row tracking upsert accepts any notification id greater
than the stored one (FIELD-NOTES 8.2): two worker processes that read the same
batch both commit it, and every derived event of the overlap is recorded twice.

Here a batch's tracking object says where it started (``GuardedTracking.expected``)
and the recorder turns the upsert into a compare-and-set in the same transaction as
the batch's events: the row moves from ``expected`` to the new id or the whole
transaction rolls back with ``PositionMovedError``. The hook is the one method both
library recorders funnel every tracking write through, ``_insert_tracking(cursor,
tracking)``; a plain ``Tracking`` keeps the library's behaviour.

Why the compare is race-free:

- SQLite: the process recorder inserts the batch's events first, which takes the
  database's write lock; a write transaction in WAL mode reads the newest state, so
  the compare sees every committed position and no other writer can commit until
  this one ends. A batch without events makes the compare its first write, which
  takes the lock the same way.
- PostgreSQL: the statement locks the tracking row (``ON CONFLICT DO UPDATE`` or
  ``UPDATE``); a concurrent transaction holding it makes this one wait, after which
  READ COMMITTED re-evaluates the ``WHERE`` on the row's newest version, so exactly
  one of two racers matches ``expected``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from uuid import UUID

from eventsourcing.application import Application, ProcessingEvent
from eventsourcing.persistence import IntegrityError, RecordConflictError, Recording, Tracking
from eventsourcing.sqlite import (
    SQLiteAggregateRecorder,
    SQLiteApplicationRecorder,
    SQLiteCursor,
    SQLiteProcessRecorder,
)

from domain.errors import PositionMovedError, StoreShapeDamagedError, VersionConflictError
from domain.under_lock import CHECK_UNDER_LOCK_WITHIN_S, asked_within
from uprof.backends.damage import (
    EVENT_ROW_COLUMNS,
    row_read_damage,
    row_shape_damage,
    rows_of_another_shape,
)
from uprof.backends.sqlite import column_type_fits
from uprof.services.idempotency import client_wait_left

__all__ = [
    "ConflictsAsDomainErrors",
    "GuardedSQLiteProcessRecorder",
    "GuardedTracking",
    "PositionMovedError",
    "RowsCheckedSQLiteApplicationRecorder",
    "RowsCheckedSQLiteRecorder",
    "ask_under_the_store_lock",
    "asked_under_the_store_lock",
    "asks_under_the_store_lock",
    "key_check_within_s",
]


TID = TypeVar("TID", bound=UUID | str)

#: The check a save asks inside its transaction once the store's own write lock is held
#: (SQLite's database write lock, taken by the first insert and waited for up to
#: ``SQLITE_LOCK_TIMEOUT``; PostgreSQL's ``LOCK TABLE ... IN EXCLUSIVE MODE``), before
#: the commit: what it raises rolls the save back. The lock may be held by another
#: process for long (another server's save, a backup, a ``sqlite3`` shell): a request's
#: key revoked while its save waited there was not seen (0218's Left, bug US).
_asked_under_the_lock: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "uprof_asked_under_the_store_lock", default=None
)


@contextlib.contextmanager
def asked_under_the_store_lock(check: Callable[[], None] | None) -> Iterator[None]:
    """Have every save of the profiles log made in this block ask ``check`` under the
    store's write lock (None: nothing asked, also for a save nested in an outer block)."""
    token = _asked_under_the_lock.set(check)
    try:
        yield
    finally:
        _asked_under_the_lock.reset(token)


def asks_under_the_store_lock() -> bool:
    """Whether a check is armed for this block's saves (``asked_under_the_store_lock``)."""
    return _asked_under_the_lock.get() is not None


#: The least time a key check is given when the client's wait (``Prefer: wait``) is
#: spent or nearly: a check answered from the row the request read takes microseconds,
#: and is not refused for time the request spent elsewhere.
CHECK_LEAST_WITHIN_S = 0.05


def key_check_within_s() -> float:
    """How long a write's key check may take: ``CHECK_UNDER_LOCK_WITHIN_S``, and no longer
    than what is left of the client's wait when it said one (``Prefer: wait``, at least
    ``CHECK_LEAST_WITHIN_S``). Past it the write is refused as an outage, 503, nothing
    written: a client that waits N seconds is answered within them, as the key's and the
    erasure's turns answer it (bugs LV, UA), not after the server's own bound (bug WJ)."""
    client = client_wait_left()
    if client is None:
        return CHECK_UNDER_LOCK_WITHIN_S
    return min(CHECK_UNDER_LOCK_WITHIN_S, max(client, CHECK_LEAST_WITHIN_S))


def ask_under_the_store_lock() -> None:
    """Ask the running block's check (``asked_under_the_store_lock``); the recorders call
    it after their inserts, inside the transaction, with the store's lock held."""
    check = _asked_under_the_lock.get()
    if check is not None:
        # Bounded: every write of every process waits for this lock, and the check may
        # read the key store (a row older than KEY_CACHE_TTL_S): one that did not answer
        # held them all, erasures too (bug VR). Past the bound: an outage, rolled back.
        asked_within(check, key_check_within_s())


class ConflictsAsDomainErrors(Application[TID], Generic[TID]):
    """An application whose saves report a lost version race as ``VersionConflictError``.

    The library raises ``RecordConflictError`` (or its ``IntegrityError``) when a stream
    version is taken; the services and ``uprof.retry`` then see the domain's transient
    error, by type, whichever backend and driver raised it. Every save (``save`` and the
    tracked saves of the profiles log) funnels through ``_record``.
    """

    def _record(self, processing_event: ProcessingEvent[TID]) -> list[Recording[TID]]:
        try:
            return super()._record(processing_event)
        except (RecordConflictError, IntegrityError) as error:
            raise VersionConflictError(
                "another writer saved to this stream first; nothing was written"
            ) from error


@dataclass(frozen=True)
class GuardedTracking(Tracking):
    """A tracking position that may only replace ``expected`` (0: no position yet)."""

    expected: int

    def __post_init__(self) -> None:
        if self.notification_id <= self.expected:
            raise ValueError(
                f"a guarded position must move forward ({self.expected} -> {self.notification_id})"
            )


class RowsCheckedSQLiteRecorder(SQLiteAggregateRecorder):
    """The library's SQLite recorder whose row reads tell a table of the wrong shape.

    The library reads each row of ``SELECT *`` by name: a column renamed or dropped by
    hand under a running process is an ``IndexError`` (sqlite3's rows) no driver names.
    Looked at then: damage if a column is missing, else the error as it was
    (0220-event-table-shape-at-start, bug TT). Used as is for the snapshot table, whose
    rows are read before a subject's events when it has a snapshot
    (0224-review-of-0220-and-0223, bug UN); the process recorder below extends it.

    SQLite alters no column's type: a table made again by hand with a version column
    TEXT converts every version to text ("1"), which the read hands on without an error
    and the library's aggregate code meets later (``version + 1``), outside this read:
    500 ``internal`` per request under a running process until the next start refused
    it. So the rows read are looked at too (their values' types, no statement), and a
    row that is not what the library wrote makes the recorder look at its table
    (0238-shapes-under-running-processes, bug WQ)."""

    def select_events(self, *args: Any, **kwargs: Any) -> Any:
        with self._rows_read_by_name():
            return self._checked_rows(super().select_events(*args, **kwargs))

    def _checked_rows(self, rows: Any) -> Any:
        """``rows``, or the damage when one is not of the shape the library wrote."""
        if rows_of_another_shape(rows):
            raise self._table_damage() or row_shape_damage(self.events_table_name)
        return rows

    def _table_damage(self) -> StoreShapeDamagedError | None:
        """The damage when this recorder's table lacks a column the library reads by
        name or has one of another type (one catalog read), else None."""
        with self.datastore.transaction(commit=False) as c:
            c.execute("SELECT name, type FROM pragma_table_info(?)", (self.events_table_name,))
            there = {str(row[0]): str(row[1]) for row in c.fetchall()}
        return row_read_damage(EVENT_ROW_COLUMNS, there, column_type_fits)

    @contextlib.contextmanager
    def _rows_read_by_name(self) -> Iterator[None]:
        try:
            yield
        except LookupError as error:
            damage = self._table_damage()
            if damage is None:
                raise
            raise damage from error


class RowsCheckedSQLiteApplicationRecorder(RowsCheckedSQLiteRecorder, SQLiteApplicationRecorder):
    """The library's application recorder, its row reads checked as
    ``RowsCheckedSQLiteRecorder``'s: the policy store's (its reads under a running
    process were the library's own, so a column renamed or a row of another shape was the
    store "unreadable", 503 "retry": 0238-shapes-under-running-processes, bug WS), and
    the base of the profiles log's guarded process recorder."""

    def select_notifications(self, *args: Any, **kwargs: Any) -> Any:
        with self._rows_read_by_name():
            return self._checked_rows(super().select_notifications(*args, **kwargs))


class GuardedSQLiteProcessRecorder(RowsCheckedSQLiteApplicationRecorder, SQLiteProcessRecorder):
    """SQLite process recorder with compare-and-set tracking (see the module docstring),
    its row reads checked as ``RowsCheckedSQLiteRecorder``'s."""

    #: What ``ProfilesApplication`` checks before it trusts a recorder with its positions.
    guards_tracking = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.datastore.single_row_tracking:
            raise ValueError("guarded tracking needs single-row tracking (SINGLE_ROW_TRACKING)")

    def _insert_events(self, c: SQLiteCursor, stored_events: Any, **kwargs: Any) -> Any:
        # The first insert took the database's write lock (the transaction is BEGIN
        # DEFERRED): from here no other process writes until this one commits or rolls
        # back, so what is asked now still holds at the commit.
        inserted = super()._insert_events(c, stored_events, **kwargs)
        ask_under_the_store_lock()
        return inserted

    def _insert_tracking(self, c: SQLiteCursor, tracking: Tracking) -> None:
        if not isinstance(tracking, GuardedTracking):
            super()._insert_tracking(c, tracking)
            return
        params = {
            "application_name": tracking.application_name,
            "notification_id": tracking.notification_id,
            "expected": tracking.expected,
        }
        if tracking.expected == 0:
            # No position yet: insert, or move a row still at 0 (another worker's
            # insert makes the WHERE false and nothing is returned).
            c.execute(
                "INSERT INTO tracking VALUES (:application_name, :notification_id) "
                "ON CONFLICT (application_name) DO UPDATE "
                "SET notification_id = excluded.notification_id "
                "WHERE tracking.notification_id = 0 RETURNING notification_id",
                params,
            )
        else:
            c.execute(
                "UPDATE tracking SET notification_id = :notification_id "
                "WHERE application_name = :application_name "
                "AND notification_id = :expected RETURNING notification_id",
                params,
            )
        if c.fetchone() is None:
            raise PositionMovedError(
                tracking.application_name, tracking.expected, tracking.notification_id
            )
