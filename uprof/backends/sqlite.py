"""SQLite, the embedded backend: one file per store in the data folder (and the key folder).

``events.sqlite`` (the eventsourcing log), ``views.sqlite`` (read models and audit log),
``policies.sqlite`` (the policy store) beside it, and ``keys.sqlite`` in the key folder,
apart from the data (decision 0012). eventsourcing's table names are fixed on SQLite, so
each application has its own file (FIELD-NOTES 2.2).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any
from uuid import UUID

import sqlalchemy as sa

from uprof.backends import Backend, StorageLayout, TableScan

if TYPE_CHECKING:
    from uprof.settings import Settings

#: The SQLite file of the policy store (its own application, so its own file).
POLICY_STORE_FILE = "policies.sqlite"
#: The table eventsourcing keeps the profiles log's events in (the log has its own file).
EVENTS_TABLE = "stored_events"


def _pragmas(dbapi_connection: Any, _record: Any, *, synchronous: str = "NORMAL") -> None:
    cursor = dbapi_connection.cursor()
    # Deleted rows must not linger in free pages (FIELD-NOTES §4); never rely on the
    # build default. WAL lets readers run beside the projection writer.
    cursor.execute("PRAGMA secure_delete=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA synchronous={synchronous}")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _pragmas_full(dbapi_connection: Any, record: Any) -> None:
    _pragmas(dbapi_connection, record, synchronous="FULL")


class SQLiteBackend:
    name = "sqlite"
    persistence_module = "eventsourcing.sqlite"
    guarded_recorder_topic = "uprof.recorders:GuardedSQLiteProcessRecorder"
    alters_in_batches = True  # SQLite's ALTER TABLE cannot change or drop most things

    def check_database_url(self, url: str) -> None:
        raise ValueError(
            "database_url must be a PostgreSQL URL (postgresql+psycopg://...); "
            "leave it unset for the embedded SQLite default"
        )

    def layout(self, settings: Settings) -> StorageLayout:
        data = settings.data_dir
        data.mkdir(parents=True, exist_ok=True)
        keys = settings.key_path
        keys.mkdir(mode=0o700, parents=True, exist_ok=True)
        events = data / "events.sqlite"
        return StorageLayout(
            views_url=f"sqlite:///{data / 'views.sqlite'}",
            keys_url=f"sqlite:///{keys / 'keys.sqlite'}",
            events_url=f"sqlite:///{events}",
            eventsourcing_env={
                "PERSISTENCE_MODULE": self.persistence_module,
                "SQLITE_DBNAME": str(events),
                "SQLITE_LOCK_TIMEOUT": "30",
            },
            events_path=events,
        )

    def policy_store_env(self, settings: Settings) -> dict[str, str]:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        return {
            "PERSISTENCE_MODULE": self.persistence_module,
            "SQLITE_DBNAME": str(settings.data_dir / POLICY_STORE_FILE),
            "SQLITE_LOCK_TIMEOUT": "30",
        }

    def create_engine(self, url: str, *, fsync_each_commit: bool) -> sa.Engine:
        engine = sa.create_engine(url, connect_args={"timeout": 30}, hide_parameters=True)
        sa.event.listen(engine, "connect", _pragmas_full if fsync_each_commit else _pragmas)
        return engine

    @contextlib.contextmanager
    def schema_lock(self, engine: sa.Engine) -> Iterator[None]:
        yield  # SQLite serialises schema changes by itself

    def fold_log(self, engine: sa.Engine) -> None:
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")

    def events_table_candidates(self, engine: sa.Engine) -> list[tuple[str | None, str]]:
        return [(None, EVENTS_TABLE)]

    def head_index_target(self) -> tuple[str, str]:
        # The rowid (the notification id) rides along in every SQLite index.
        return EVENTS_TABLE, "originator_id"

    def events_table(self, recorder: Any) -> tuple[str, str]:
        return recorder.events_table_name, "rowid"

    def tracking_table(self, recorder: Any) -> str:
        return "tracking"  # the library's fixed name on SQLite

    def stream_key(self, stream_id: UUID) -> str:
        return stream_id.hex  # eventsourcing keeps uuids as 32-hex text on SQLite

    def driver_param(self, name: str) -> str:
        return f":{name}"  # sqlite3's named style

    def end_raw_read(self, raw: Any) -> None:
        return None  # sqlite3 opens no transaction for a SELECT

    def any_of(self, column: str, ids: Sequence[str], cast: str = "") -> tuple[str, Any]:
        # One JSON list through json_each instead of an expanded IN list.
        return f"{column} IN (SELECT value FROM json_each(:ids))", json.dumps(list(ids))

    def scan_tables(self, engine: sa.Engine, terms: Sequence[str]) -> TableScan:
        # The databases are files in the data folder: the file scan's child reads them
        # (raw bytes and tables, from a snapshot; FIELD-NOTES 8.1).
        return TableScan(0, [])


#: Typed as the protocol, so the type checker holds the class to all of it.
SQLITE: Backend = SQLiteBackend()
