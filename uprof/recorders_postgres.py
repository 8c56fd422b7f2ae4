"""The PostgreSQL process recorder with compare-and-set tracking (``uprof.recorders``
explains the guard). A module of its own so that SQLite deployments never import psycopg."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from eventsourcing.persistence import DataError, NotSupportedError, ProgrammingError, Tracking
from eventsourcing.postgres import (
    PostgresAggregateRecorder,
    PostgresApplicationRecorder,
    PostgresProcessRecorder,
)
from psycopg.sql import SQL, Composable, Composed, Identifier

from domain.errors import PositionMovedError
from uprof.backends.damage import (
    EVENT_ROW_COLUMNS,
    row_read_damage,
    row_shape_damage,
    rows_of_another_shape,
)
from uprof.backends.postgres import COLUMNS_OF_TABLES, column_type_fits, refuse_if_stores_lost
from uprof.recorders import (
    GuardedTracking,
    ask_under_the_store_lock,
    asks_under_the_store_lock,
)

#: ``COLUMNS_OF_TABLES`` in psycopg's parameter style (one statement for both readers).
_COLUMNS = SQL(COLUMNS_OF_TABLES.replace(":schema", "%(schema)s").replace(":tables", "%(tables)s"))

_T = TypeVar("_T")

#: An expression per column the library writes that PostgreSQL can plan only for the
#: type the library made it (``get_byte`` takes bytea alone, ``+ 1`` a number, ``lower``
#: text, ``=`` with a uuid a uuid): the write's typed look at its table.
_TYPED_AS_MADE = {
    "state": "get_byte(state, 0)",
    "originator_version": "originator_version + 1",
    "topic": "lower(topic)",
    "notification_id": "notification_id + 1",
}


class RowsCheckedPostgresRecorder(PostgresAggregateRecorder):
    """As ``uprof.recorders.RowsCheckedSQLiteRecorder``: psycopg's dict rows raise
    ``KeyError`` for a column renamed or dropped by hand; a column whose type was
    altered by hand reads back what the library's code cannot use (``TypeError``) or
    makes its statement fail ("operator does not exist", ``ProgrammingError``). Looked
    at, damage if a column the library reads is missing or of another type, else the
    error as it was. As is, the snapshot table's recorder (0224-review-of-0220-and-0223,
    bug UN). A row read back with a NULL put in by hand is damage too (its read's
    ``TypeError``, or a row of another shape handed on: 0238-shapes-under-running-
    processes, bug WS).

    Its writes look at the table's types in their own transaction (bug WR): PostgreSQL
    converts the library's bytes into a column altered to text by hand (an assignment
    cast), so a new stream's first write under a running process went in, and every read
    of it after failed. One statement more in the write's pipeline, planned once."""

    #: The columns the library reads each row of this recorder's table by.
    read_by_name = EVENT_ROW_COLUMNS

    def select_events(self, *args: Any, **kwargs: Any) -> Any:
        originator_id = args[0] if args else kwargs["originator_id"]
        return self._checked_rows(
            self._read_checked(
                lambda: super(RowsCheckedPostgresRecorder, self).select_events(*args, **kwargs),
                ("originator_id = %(scope)s", originator_id),
            )
        )

    def insert_events(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().insert_events(*args, **kwargs)
        except (ProgrammingError, DataError) as error:
            self._refuse_if_reshaped(error)
            raise

    def _insert_stored_events(self, curs: Any, *args: Any, **kwargs: Any) -> None:
        # Before the library's insert, in its transaction (its pipeline, where it has
        # one): a column of another type fails the planning of this statement, so the
        # write is rolled back and ``insert_events`` looks at the table.
        curs.execute(self._typed_look, prepare=True)
        super()._insert_stored_events(curs, *args, **kwargs)

    @functools.cached_property
    def _typed_look(self) -> Composed:
        checked: list[Composable] = [
            SQL(_TYPED_AS_MADE[column])
            for column in sorted(self.read_by_name & set(_TYPED_AS_MADE))
        ]
        checked.append(
            SQL("originator_id = NULL::{0}").format(Identifier(self.datastore.originator_id_type))
        )
        return SQL("SELECT {0} FROM {1}.{2} LIMIT 0").format(
            SQL(", ").join(checked),
            Identifier(self.datastore.schema),
            Identifier(self.events_table_name),
        )

    def _checked_rows(self, rows: Any) -> Any:
        """``rows``, or the damage when one is not of the shape the library wrote."""
        if rows_of_another_shape(rows):
            self._refuse_if_reshaped(None)
            raise row_shape_damage(self.events_table_name)
        return rows

    def _read_checked(self, read: Callable[[], _T], scope: tuple[str, Any] | None = None) -> _T:
        """``read()``, a table of the wrong shape told as damage. The library reads by
        name, and prepares its reads: a table altered under a running process is met
        first as PostgreSQL's refusal of the prepared statement ("cached plan must not
        change result type"), then as the row read's error. Either way the table is
        looked at: a column read by name missing or of another type is damage; else the
        refusal is read again (a read changes nothing; a column added, or renamed back, is
        not damage: 0224-review-of-0220-and-0223, bug UO), any other error stays a fault,
        unless the rows the read took in (``scope``: a condition on them) hold a NULL the
        library's conversion met (``bytes(None)``): a row of another shape, damage.

        Read again until a connection without the stale plan answers: each pooled
        connection prepared the statement on its own, and the rollback after the refusal
        drops only that connection's, so the next read may take another connection that
        still holds it (the pool hands them out in turn). One read per connection the pool
        may hold, and one more, at most (0228-review-of-0224-and-store-shapes, bug UY).
        The table is looked at once, at the first refusal: looked at each time, its own
        connection taken between two reads, a pool of two connections gave the reads the
        same stale one every time, and a capture failed 500 (bug YS, 0253-postgres-case-cost)."""
        stale_plans = 0
        while True:
            try:
                return read()
            except NotSupportedError as error:
                if not stale_plans:  # looked at once: the reads again take no connection
                    self._refuse_if_reshaped(error)
                stale_plans += 1
                if stale_plans > self._connections_at_most():
                    raise
            except TypeError as error:
                self._refuse_if_reshaped(error)
                if scope is not None and self._null_in(*scope):
                    raise row_shape_damage(self.events_table_name) from error
                raise
            except (LookupError, ProgrammingError, DataError) as error:
                self._refuse_if_reshaped(error)
                raise

    def _null_in(self, condition: str, value: Any) -> bool:
        """Whether a row of this table where ``condition`` holds has a NULL where the
        library never writes one (one read, on the failed read's rows only)."""
        statement = SQL(
            "SELECT 1 FROM {0}.{1} WHERE " + condition + " AND (state IS NULL OR topic IS NULL "
            "OR originator_version IS NULL) LIMIT 1"
        ).format(Identifier(self.datastore.schema), Identifier(self.events_table_name))
        with self.datastore.transaction(commit=False) as curs:
            curs.execute(statement, {"scope": value})
            return curs.fetchone() is not None

    def _connections_at_most(self) -> int:
        return int(self.datastore.pool.max_size)

    def _refuse_if_reshaped(self, error: Exception | None) -> None:
        with self.datastore.transaction(commit=False) as curs:
            curs.execute(
                _COLUMNS, {"schema": self.datastore.schema, "tables": [self.events_table_name]}
            )
            there = {str(row["attname"]): str(row["typname"]) for row in curs.fetchall()}
        damage = row_read_damage(self.read_by_name, there, column_type_fits)
        if damage is not None:
            raise damage from error


class RowsCheckedPostgresApplicationRecorder(
    RowsCheckedPostgresRecorder, PostgresApplicationRecorder
):
    """The library's application recorder, its reads and writes checked as
    ``RowsCheckedPostgresRecorder``'s: the policy store's (0238-shapes-under-running-
    processes, bug WS), and the base of the profiles log's guarded process recorder."""

    #: This table's notification ids are a column the library reads by name too.
    read_by_name = EVENT_ROW_COLUMNS | {"notification_id"}

    def select_notifications(self, *args: Any, **kwargs: Any) -> Any:
        start = args[0] if args else kwargs.get("start")
        return self._checked_rows(
            self._read_checked(
                lambda: super(RowsCheckedPostgresApplicationRecorder, self).select_notifications(
                    *args, **kwargs
                ),
                ("notification_id >= %(scope)s", start or 0),
            )
        )


class GuardedPostgresProcessRecorder(
    RowsCheckedPostgresApplicationRecorder, PostgresProcessRecorder
):
    """PostgreSQL process recorder with compare-and-set tracking (see ``uprof.recorders``),
    its row reads checked as ``RowsCheckedPostgresRecorder``'s."""

    #: What ``ProfilesApplication`` checks before it trusts a recorder with its positions.
    guards_tracking = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.datastore.single_row_tracking:
            raise ValueError("guarded tracking needs single-row tracking (SINGLE_ROW_TRACKING)")
        if self.datastore.enable_db_functions:
            # That insert path calls a stored function and never writes tracking.
            raise ValueError("guarded tracking does not work with POSTGRES_ENABLE_DB_FUNCTIONS")
        table = (Identifier(self.datastore.schema), Identifier(self.tracking_table_name))
        self._guarded_insert = SQL(
            "INSERT INTO {0}.{1} VALUES (%(application_name)s, %(notification_id)s) "
            "ON CONFLICT (application_name) DO UPDATE "
            "SET notification_id = excluded.notification_id "
            "WHERE {0}.{1}.notification_id = 0 RETURNING notification_id"
        ).format(*table)
        self._guarded_update = SQL(
            "UPDATE {0}.{1} SET notification_id = %(notification_id)s "
            "WHERE application_name = %(application_name)s "
            "AND notification_id = %(expected)s RETURNING notification_id"
        ).format(*table)

    def _insert_events(self, curs: Any, stored_events: Any, **kwargs: Any) -> None:
        # This pool is not the views engine's: a process that lost its hold on the stores
        # (uprof.backends.postgres._OpenHold) must not append to a log it no longer holds.
        refuse_if_stores_lost()
        if stored_events and asks_under_the_store_lock():
            # The library takes the table's lock (LOCK TABLE ... IN EXCLUSIVE MODE) with
            # its inserts, after this method, in pipeline mode, where an error raised is
            # held until its transaction has committed. Taken here first and waited for
            # (the pipeline synced), the check is asked with the lock held and what it
            # raises rolls the transaction back (``uprof.recorders.ask_under_the_store_
            # lock``, bug US); the library's own LOCK TABLE then finds it held.
            self._lock_table(curs)
            with curs.connection.pipeline() as pipeline:
                pipeline.sync()
            ask_under_the_store_lock()
        super()._insert_events(curs, stored_events, **kwargs)

    def _insert_tracking(self, curs: Any, tracking: Tracking) -> None:
        if not isinstance(tracking, GuardedTracking):
            super()._insert_tracking(curs, tracking)
            return
        statement = self._guarded_insert if tracking.expected == 0 else self._guarded_update
        curs.execute(
            query=statement,
            params={
                "application_name": tracking.application_name,
                "notification_id": tracking.notification_id,
                "expected": tracking.expected,
            },
            prepare=True,
        )
        if curs.fetchone() is None:
            raise PositionMovedError(
                tracking.application_name, tracking.expected, tracking.notification_id
            )
