"""The PostgreSQL process recorder with compare-and-set tracking (``uprof.recorders``
explains the guard). A module of its own so that SQLite deployments never import psycopg."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from eventsourcing.persistence import Tracking
from eventsourcing.postgres import PostgresProcessRecorder
from psycopg.sql import SQL, Identifier

from domain.errors import PositionMovedError
from uprof.backends.damage import EVENT_ROW_COLUMNS, row_read_damage
from uprof.backends.postgres import refuse_if_stores_lost
from uprof.recorders import GuardedTracking

#: A table's columns (as ``PostgresBackend.table_columns``), by schema and name.
_COLUMNS = SQL(
    "SELECT a.attname FROM pg_catalog.pg_attribute a "
    "JOIN pg_catalog.pg_class c ON c.oid = a.attrelid "
    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped"
)


class GuardedPostgresProcessRecorder(PostgresProcessRecorder):
    """PostgreSQL process recorder with compare-and-set tracking (see ``uprof.recorders``)."""

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

    def select_events(self, *args: Any, **kwargs: Any) -> Any:
        with self._rows_read_by_name():
            return super().select_events(*args, **kwargs)

    def select_notifications(self, *args: Any, **kwargs: Any) -> Any:
        with self._rows_read_by_name():
            return super().select_notifications(*args, **kwargs)

    @contextlib.contextmanager
    def _rows_read_by_name(self) -> Iterator[None]:
        """As SQLite's (``uprof.recorders``): psycopg's dict rows raise ``KeyError`` for
        a column renamed or dropped by hand; looked at, damage if one is missing (this
        table's notification ids are a column read by name too), else the error."""
        try:
            yield
        except LookupError as error:
            with self.datastore.transaction(commit=False) as curs:
                curs.execute(_COLUMNS, (self.datastore.schema, self.events_table_name))
                there = frozenset(str(row["attname"]) for row in curs.fetchall())
            damage = row_read_damage(EVENT_ROW_COLUMNS | {"notification_id"}, there)
            if damage is None:
                raise
            raise damage from error

    def _insert_events(self, curs: Any, stored_events: Any, **kwargs: Any) -> None:
        # This pool is not the views engine's: a process that lost its hold on the stores
        # (uprof.backends.postgres._OpenHold) must not append to a log it no longer holds.
        refuse_if_stores_lost()
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
