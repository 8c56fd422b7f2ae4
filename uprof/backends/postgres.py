"""PostgreSQL: one database for every store (``UPROF_DATABASE_URL``).

eventsourcing names its tables after the application (``profiles_events``,
``policies_events``); alembic owns the rest. The key material that unwraps the key
tables stays in the key folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import select
import shutil
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

import sqlalchemy as sa

from domain.errors import StoresLostError
from uprof.backends import (
    SCHEMA_LOCK_STOP_CHECK_S,
    Backend,
    StorageLayout,
    StoresInUseError,
    TableScan,
    TermHit,
    described_holder,
    lending_lock_connection,
    policy_recorders,
    reading_connection,
    schema_lock_holder,
    upsert_from_with,
    upsert_with,
    wait_for_schema_lock,
)

if TYPE_CHECKING:
    from uprof.settings import Settings

#: The policy store's eventsourcing application name (``PolicyApplication.name``), which
#: names its tables.
POLICY_STORE_NAME = "policies"
#: Advisory lock key that processes starting on one PostgreSQL database queue on.
SCHEMA_LOCK_KEY = 0x7570726F66  # "uprof"
#: Advisory lock key every running process holds shared for its life (``hold_open``) and
#: ``uprof restore`` exclusively (``stores_alone``).
OPEN_LOCK_KEY = SCHEMA_LOCK_KEY + 1
#: The backup's one file: ``pg_dump --format=custom`` of every table but the key store's.
PG_DUMP = "database.dump"
#: eventsourcing names the table after the application ("profiles").
EVENTS_TABLE = "profiles_events"


#: SQLSTATEs worth another attempt: lock not available, serialization failure, deadlock.
_RETRYABLE_STATES = frozenset({"55P03", "40001", "40P01"})


#: Seconds a policy-store read waits for a connection of its pool (``policy_store_env``).
POLICY_POOL_WAIT_S = 2


#: Each table's columns and their types (``pg_type.typname``), for every table of
#: ``tables`` in ``schema`` (the session's own when none): the stores' shape checks at
#: start and the event store's recorders' look at a failed read.
COLUMNS_OF_TABLES = (
    "SELECT c.relname, a.attname, t.typname FROM pg_catalog.pg_attribute a "
    "JOIN pg_catalog.pg_class c ON c.oid = a.attrelid "
    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "JOIN pg_catalog.pg_type t ON t.oid = a.atttypid "
    "WHERE n.nspname = COALESCE(CAST(:schema AS name), current_schema()) "
    "AND c.relname = ANY(:tables) AND a.attnum > 0 AND NOT a.attisdropped"
)
#: The types eventsourcing's columns may have and still give it back what it wrote (the
#: library makes uuid, bigint, text, bytea): a smaller integer or a varchar reads back
#: the same Python value; text where it keeps an integer, bytes or a uuid does not (its
#: ``bytes(row["state"])`` fails, its ``originator_version > %s`` is "operator does not
#: exist").
_INTEGERS = frozenset({"int2", "int4", "int8"})
_LIBRARY_COLUMN_TYPES = {
    "originator_id": frozenset({"uuid"}),
    "originator_version": _INTEGERS,
    "notification_id": _INTEGERS,
    "topic": frozenset({"text", "varchar"}),
    "application_name": frozenset({"text", "varchar"}),
    "state": frozenset({"bytea"}),
}


def column_type_fits(column: str, declared: str) -> bool:
    """``PostgresBackend.column_type_fits``, for the recorders too (no backend there)."""
    fitting = _LIBRARY_COLUMN_TYPES.get(column)
    return fitting is None or declared in fitting


#: PostgreSQL's SQLSTATE for a database that does not exist (``invalid_catalog_name``).
INVALID_CATALOG_NAME = "3D000"

#: Databases every PostgreSQL server has, where the catalogue of databases is read when
#: the one a URL names refused the connection (``database_missing``).
MAINTENANCE_DATABASES = ("postgres", "template1")
#: A PostgreSQL URL that names no driver (libpq's form); read as psycopg 3's (bug XJ).
PLAIN_SCHEME = "postgresql://"
#: The connection's parts eventsourcing's event log takes (its ``POSTGRES_*`` settings),
#: as libpq names them; the only query parameters a URL may carry (bug YA).
EVENT_LOG_PARTS = frozenset({"dbname", "host", "port", "user", "password"})


def connection_parts(url: str) -> dict[str, str]:
    """What the engines hand libpq for ``url``: SQLAlchemy's own reading of it (its psycopg
    dialect's), the query's parameters over the parts before it and several hosts
    joined with commas, as text. The event log's settings and the client tools take
    their parts from here, so that every store is reached where the engines reach it."""
    parsed = sa.engine.make_url(url)
    _, params = parsed.get_dialect()().create_connect_args(parsed)
    return {name: str(value) for name, value in params.items() if value is not None}


def database_place(url: sa.URL) -> str:
    """The database ``url`` reaches, for a message: its name, host and port as libpq is
    handed them (``connection_parts``: the query's parts over those before it). Read
    from the URL's parts alone, a ``?host=`` URL was named "at None:5432" and a
    ``?dbname=`` one by no name (bug YF). No host is libpq's default, the local socket."""
    parts = connection_parts(url.render_as_string(hide_password=False))
    port = parts.get("port", "5432")
    host = parts.get("host")
    where = f"at {host}:{port}" if host else f"on the local socket (port {port})"
    return f"the PostgreSQL database {parts.get('dbname', '')} {where}"


class PostgresBackend:
    name = "postgres"
    backup_files: tuple[str, ...] = (PG_DUMP,)
    persistence_module = "eventsourcing.postgres"
    # Its own module: a SQLite deployment never imports psycopg (decision 0035).
    guarded_recorder_topic = "uprof.recorders_postgres:GuardedPostgresProcessRecorder"
    snapshot_recorder_topic = "uprof.recorders_postgres:RowsCheckedPostgresRecorder"
    checked_application_recorder_topic = (
        "uprof.recorders_postgres:RowsCheckedPostgresApplicationRecorder"
    )
    writes_rows_by_position = False
    alters_in_batches = False
    key_folder_stores: tuple[str, ...] = ()  # the key tables are in the database

    def check_database_url(self, url: str) -> str:
        # eventsourcing talks to PostgreSQL through psycopg 3; so must every engine.
        if url.startswith(PLAIN_SCHEME):
            # libpq's own form (psql's, pg_dump's): SQLAlchemy reads it as psycopg2, which
            # uprof does not ship, and every command ended in its ModuleNotFoundError's
            # traceback (bug XJ). The driver uprof ships is named instead.
            url = "postgresql+psycopg://" + url[len(PLAIN_SCHEME) :]
        if not url.startswith("postgresql+psycopg://"):
            raise ValueError(
                "database_url must be a PostgreSQL URL (postgresql+psycopg://...); "
                "leave it unset for the embedded SQLite default"
            )
        # Read twice: the engines hand the URL to libpq, which fills a part left out from
        # its defaults (the user's name for the database, the system user for the user,
        # PGDATABASE, PGUSER); the event log's settings (``layout``) take the parts as
        # written. A part left out put the event log in another database, or under
        # another role, than the views (bug XN): the URL names both.
        try:
            parsed = sa.engine.make_url(url)
            parts = connection_parts(url)
        except (sa.exc.ArgumentError, ValueError):
            raise ValueError("database_url is not a URL uprof can read") from None
        # The query string is read by the engines as libpq reads it, but the event log
        # takes only the connection's parts (``EVENT_LOG_PARTS``): any other parameter
        # held for some of the deployment's connections and not for the event log's
        # (``sslmode``), and one libpq does not know ended in psycopg's traceback (YA).
        for name, value in parsed.query.items():
            if name not in EVENT_LOG_PARTS:
                raise ValueError(
                    f"database_url: the query parameter {name!r} is not taken: uprof's "
                    "event log connects with the database, host, port, user and password "
                    "alone, so it would hold for some of the deployment's connections and "
                    "not for others; set libpq's environment variable for it instead (such "
                    "as PGSSLMODE for sslmode), which every connection reads"
                )
            if isinstance(value, tuple) and name != "host":
                raise ValueError(f"database_url: the query parameter {name!r} is given twice")
        for part, key in (("database", "dbname"), ("user", "user")):
            if not parts.get(key):
                raise ValueError(
                    f"database_url must name the {part} "
                    "(postgresql+psycopg://USER@HOST:PORT/DATABASE): left out, the event "
                    "log and the other stores would each fill it in their own way"
                )
        # Kept with the user, password and database in their own places, so that every
        # reader of the URL's parts (the messages naming the database, the look for a
        # missing one) reads what the engines connect to (YA). A host in the query (a
        # Unix socket's folder, several hosts) stays there: it has no other place.
        query = parsed.query
        if not {"user", "password", "dbname"} & set(query):
            return url
        # ``parts`` holds them as the engines read them (the query's winning); each was
        # given once (refused above otherwise), so each is text.
        return (
            parsed.set(
                username=parts["user"],
                password=parts.get("password", parsed.password),
                database=parts["dbname"],
                query={k: v for k, v in query.items() if k not in ("user", "password", "dbname")},
            )
        ).render_as_string(hide_password=False)

    def layout(self, settings: Settings) -> StorageLayout:
        assert settings.database_url is not None
        parts = connection_parts(settings.database_url)
        return StorageLayout(
            views_url=settings.database_url,
            keys_url=settings.database_url,
            events_url=settings.database_url,
            eventsourcing_env={
                "PERSISTENCE_MODULE": self.persistence_module,
                # As the engines hand them to libpq (``connection_parts``), the query's
                # host and port included: a Unix socket's ``?host=/run/postgresql`` put
                # the event log on 127.0.0.1 (bug YA). A part left out is left to libpq's
                # default, as for the engines ("": the Unix socket, port 5432).
                "POSTGRES_DBNAME": parts["dbname"],
                "POSTGRES_HOST": parts.get("host", ""),
                "POSTGRES_PORT": parts.get("port", ""),
                "POSTGRES_USER": parts["user"],
                "POSTGRES_PASSWORD": parts.get("password", ""),
                # eventsourcing's pool (psycopg_pool) opens a connection when a caller
                # waits for one and none is free, up to 15 (decision
                # 0048-postgres-connections-per-process), and closes one left unused for
                # ten minutes. No minimum: one opened at the pool's first use raced its
                # first caller, which made the pool grow by one more at once (2 + 1
                # sessions per start where a command uses one; 0253-postgres-case-cost).
                "POSTGRES_POOL_SIZE": "0",
                "POSTGRES_MAX_OVERFLOW": "15",
            },
            events_path=None,
        )

    def policy_store_env(self, settings: Settings) -> dict[str, str]:
        # The profiles log's database, in tables of its own (policies_events, ...); few
        # connections: one decision-time version check and the rare change.
        env = dict(self.layout(settings).eventsourcing_env)
        env.update(
            {
                # Opened on need, up to 6, as the profiles log's (1 + 1 per start before).
                "POSTGRES_POOL_SIZE": "0",
                "POSTGRES_MAX_OVERFLOW": "6",
                # How long a read waits for a connection of this pool (psycopg_pool's
                # ``timeout``; eventsourcing names it the connect timeout, 30 s unset).
                # A decision's version check holds the policy's lock, and eventsourcing
                # tries a failed read ten times: with the database down every request of
                # the process waited 10 x 30 s behind it (review of 0176, bug NK). Few
                # readers share this pool, so a short wait refuses nothing in service.
                "POSTGRES_CONNECT_TIMEOUT": str(POLICY_POOL_WAIT_S),
                **policy_recorders(self),
            }
        )
        return env

    def create_engine(self, url: str, *, fsync_each_commit: bool) -> sa.Engine:
        # Every commit is durable on PostgreSQL (synchronous_commit): nothing to choose.
        return sa.create_engine(
            url, pool_pre_ping=True, pool_size=5, max_overflow=10, hide_parameters=True
        )

    @contextlib.contextmanager
    def schema_lock(self, engine: sa.Engine, *, wait_s: float, purpose: str) -> Iterator[None]:
        # Two processes creating eventsourcing's tables at the same moment crash one of
        # them in the catalog ("tuple concurrently updated"): an advisory lock held on its
        # own connection orders them. Tried without blocking (``_poll_advisory``): a
        # holder stopped, not killed, keeps its session and its lock, and a blocking
        # pg_advisory_lock hung every other start for ever, saying nothing.
        store = database_place(engine.url)
        with engine.connect() as conn:
            wait_for_schema_lock(
                lambda deadline, stopping: _poll_advisory(
                    conn, "pg_try_advisory_lock", SCHEMA_LOCK_KEY, deadline, stopping
                ),
                lambda: _schema_lock_holder_of(conn),
                store=store,
                wait_s=wait_s,
            )
            # Who holds it, for the processes waiting: the session's name, which
            # pg_stat_activity shows beside the lock in pg_locks (``_schema_lock_holder_of``).
            conn.execute(
                sa.text("SELECT set_config('application_name', :name, false)"),
                {"name": _holder_name(schema_lock_holder(purpose))},
            )
            conn.commit()
            try:
                # The holder's reads under the lock go through this connection, idle
                # while it works (``lock_connection``): one session fewer per start.
                with lending_lock_connection(engine, conn):
                    yield
            finally:
                conn.rollback()  # a read it lent itself to left a transaction open
                conn.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": SCHEMA_LOCK_KEY})
                conn.execute(sa.text("RESET application_name"))  # a pooled connection
                conn.commit()

    @contextlib.contextmanager
    def migration_transaction(self, engine: sa.Engine) -> Iterator[sa.Connection]:
        # PostgreSQL's DDL is transactional: the whole upgrade commits or none of it.
        with engine.begin() as conn:
            yield conn

    @contextlib.contextmanager
    def named_lock(
        self,
        engine: sa.Engine,
        name: str,
        *,
        wait_s: float,
        previous_release_shared: str | None = None,
    ) -> Iterator[bool]:
        # A session-level advisory lock on a connection of its own; the server drops it
        # when the session ends, the holder's death included. Keyed by 64 bits of a
        # sha256 of the name (no two names in use share a key in practice: bug KC).
        # Tried without blocking until ``wait_s`` has passed. The connection comes from
        # the engine's lock engine, never from its pool: a holder keeps it for all the
        # work it guards (an erasure), which takes its connections from the pool, and
        # holders pinning pooled connections starved that work (bug KD). The previous
        # release's lock (``previous_release_shared``, bug KJ) was the same advisory
        # key of its name, exclusive; here it is taken shared, on the same session.
        key = _advisory_key(name)
        with _lock_engine(engine).connect() as conn:
            deadline = time.monotonic() + wait_s
            held = _poll_advisory(conn, "pg_try_advisory_lock", key, deadline)
            old_key = (
                None if previous_release_shared is None else _advisory_key(previous_release_shared)
            )
            if held and old_key is not None:
                if not _poll_advisory(conn, "pg_try_advisory_lock_shared", old_key, deadline):
                    conn.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": key})
                    conn.commit()
                    held = False
            try:
                yield held
            finally:
                if held:
                    conn.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": key})
                    if old_key is not None:
                        conn.execute(
                            sa.text("SELECT pg_advisory_unlock_shared(:key)"), {"key": old_key}
                        )
                    conn.commit()

    def fold_log(self, engine: sa.Engine, *, timeout_s: float | None = None) -> bool:
        return True  # the server's WAL is not ours to fold (docs/governance.md, residue)

    def hold_open(self, engine: sa.Engine) -> Callable[[], None]:
        # A session-level advisory lock on a connection of its own, kept for the life of
        # the process (processes may run on several hosts: no file lock can see them all);
        # the server drops it when the session ends, kill -9 of the process included, and
        # also when the server ends the session while the process lives on: _OpenHold
        # notices at the next use of the engine.
        return _OpenHold(engine).release

    @contextlib.contextmanager
    def stores_alone(self, engine: sa.Engine) -> Iterator[None]:
        conn = _advisory(engine, shared=False)
        try:
            yield
        finally:
            try:
                conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": OPEN_LOCK_KEY})
                conn.commit()
                conn.close()
            except sa.exc.DBAPIError:
                conn.invalidate()

    def events_table_candidates(self, engine: sa.Engine) -> list[tuple[str | None, str]]:
        return [(s, EVENTS_TABLE) for s in sa.inspect(engine).get_schema_names()]

    def head_index_target(self) -> tuple[str, str]:
        # Unqualified: the table eventsourcing created on the connection's search path.
        return EVENTS_TABLE, "originator_id, notification_id"

    def events_table(self, recorder: Any) -> tuple[str, str]:
        schema = recorder.datastore.schema
        return f'"{schema}"."{recorder.events_table_name}"', "notification_id"

    def tracking_table(self, recorder: Any) -> str:
        schema = recorder.datastore.schema
        return f'"{schema}"."{recorder.tracking_table_name}"'

    def table_columns(
        self, engine: sa.Engine, tables: Sequence[str], *, schema: str | None
    ) -> dict[str, dict[str, str]]:
        # pg_attribute, not information_schema.columns (a view with per-row privilege
        # checks): one cheap catalog read for every table at once. Dropped columns stay in
        # pg_attribute, marked; system columns have attnum <= 0.
        statement = sa.text(COLUMNS_OF_TABLES)
        found: dict[str, dict[str, str]] = {}
        with reading_connection(engine) as conn:  # a start's: the schema lock's own
            for table, column, declared in conn.execute(
                statement, {"schema": schema or None, "tables": list(tables)}
            ):
                found.setdefault(str(table), {})[str(column)] = str(declared)
        return found

    def column_type_fits(self, column: str, declared: str) -> bool:
        return column_type_fits(column, declared)

    def stream_key(self, stream_id: UUID) -> str:
        return str(stream_id)  # a uuid column: psycopg adapts the text form

    def driver_param(self, name: str) -> str:
        return f"%({name})s"  # psycopg's named style

    def end_raw_read(self, raw: Any) -> None:
        raw.rollback()  # end the read transaction psycopg opened

    def any_of(self, column: str, ids: Sequence[str], cast: str = "") -> tuple[str, Any]:
        # One array instead of an expanded IN list.
        return f"{column} = ANY(CAST(:ids AS {cast or 'text'}[]))", list(ids)

    def bound_lock_waits(self, conn: sa.Connection, seconds: float) -> None:
        # For this transaction only (set_config's ``true``): gone when the connection
        # goes back to the pool, which rolls it back.
        conn.execute(
            sa.text("SELECT set_config('lock_timeout', :ms, true)"),
            {"ms": f"{int(seconds * 1000)}ms"},
        )

    def is_transient_lock(self, error: BaseException | None) -> bool:
        return getattr(error, "sqlstate", None) in _RETRYABLE_STATES

    def text_position(self, column: sa.ColumnElement[str], needle: str) -> sa.ColumnElement[int]:
        position: sa.ColumnElement[int] = sa.func.strpos(column, needle)
        return position

    def append_only_ddl(self, tables: Sequence[str]) -> list[str]:
        # CREATE OR REPLACE TRIGGER: PostgreSQL 14 or later.
        statements = [
            "CREATE OR REPLACE FUNCTION uprof_audit_append_only() RETURNS trigger "
            "LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION USING MESSAGE = TG_TABLE_NAME "
            "|| ' is append-only (' || TG_OP || ' refused)'; END $$"
        ]
        for table in tables:
            statements += [
                f"CREATE OR REPLACE TRIGGER trg_{table}_no_update_delete BEFORE UPDATE OR DELETE "
                f"ON {table} FOR EACH ROW EXECUTE FUNCTION uprof_audit_append_only()",
                f"CREATE OR REPLACE TRIGGER trg_{table}_no_truncate BEFORE TRUNCATE "
                f"ON {table} FOR EACH STATEMENT EXECUTE FUNCTION uprof_audit_append_only()",
            ]
        return statements

    def drop_append_only_ddl(self) -> list[str]:
        return ["DROP FUNCTION IF EXISTS uprof_audit_append_only()"]

    @contextlib.contextmanager
    def flushed_transaction(self, engine: sa.Engine) -> Iterator[sa.Connection]:
        # Flushed whatever the database's own setting (an operator, or a test fixture,
        # may set synchronous_commit off for the database): on for this transaction only.
        with engine.begin() as conn:
            conn.execute(sa.select(sa.func.set_config("synchronous_commit", "on", True)))
            yield conn

    @contextlib.contextmanager
    def unflushed_transaction(self, engine: sa.Engine) -> Iterator[sa.Connection]:
        # This transaction only (set_config's is_local): the engine's other commits flush.
        with engine.begin() as conn:
            conn.execute(sa.select(sa.func.set_config("synchronous_commit", "off", True)))
            yield conn

    def log_location(self, engine: sa.Engine) -> str:
        return "postgresql"

    @contextlib.contextmanager
    def serialised_transaction(
        self, engine: sa.Engine, lock_key: int, *, flush: bool = True
    ) -> Iterator[sa.Connection]:
        # READ COMMITTED: each statement after the lock sees every earlier holder's commit.
        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="READ COMMITTED")
            with conn.begin():
                lock = sa.func.pg_advisory_xact_lock(lock_key)
                if flush:
                    conn.execute(sa.select(lock))
                else:
                    # This transaction only, in the lock's round trip: the WAL writer
                    # flushes its commit within a few hundred ms.
                    local = sa.func.set_config("synchronous_commit", "off", True)
                    conn.execute(sa.select(lock, local))
                yield conn

    def upsert_from(
        self, table: sa.Table, select: sa.Select[Any], keys: Sequence[sa.Column[Any]]
    ) -> sa.Insert:
        from sqlalchemy.dialects.postgresql import insert

        return upsert_from_with(insert, table, select, keys)

    def upsert(
        self,
        table: sa.Table,
        rows: Sequence[Mapping[str, Any]],
        keys: Sequence[sa.Column[Any]],
        set_: Mapping[str, Any],
    ) -> sa.Executable:
        from sqlalchemy.dialects.postgresql import insert

        return upsert_with(insert, table, rows, keys, set_)

    def scan_tables(self, engine: sa.Engine, terms: Sequence[str]) -> TableScan:
        # One read of each table for all the terms, matched here as the file scan's child
        # matches SQLite's tables (residue_files.Matcher: case, normal forms, JSON escapes).
        # A query per column per term read each table columns x terms times on the server
        # and compared bytea through encode(.., 'escape'), which spells every non-ASCII
        # byte as an octal escape (bug OQ). Each table is read in a transaction of its
        # own, streamed, so the scan holds one table's ACCESS SHARE lock at a time and
        # only while it reads it (a DDL waiting on it would queue the writers behind it).
        from uprof.services.residue_files import Matcher

        matcher = Matcher(terms)
        scan = TableScan(0, [])
        read: set[int] = set()
        # Listed again once the listed ones are read: a relation created meanwhile is
        # read too; one created after the last listing is named, never passed over (PU).
        for listing in range(_LISTINGS):
            fresh = [r for r in _stored_relations(engine) if r.oid not in read]
            if not fresh:
                break
            if listing == _LISTINGS - 1:
                scan.unreadable.extend(
                    (
                        r.shown,
                        "created while the scan read the others, after its last "
                        "listing: scan again",
                    )
                    for r in fresh
                )
                break
            for relation in fresh:
                read.add(relation.oid)
                if relation.kind == "f":
                    # Its rows are another server's: reading them would query that server
                    # from the audit, with the deployment's credentials (bug PU).
                    scan.unreadable.append(
                        (
                            relation.shown,
                            "a foreign table: its rows are on another server, which this "
                            "scan does not read; scan that server",
                        )
                    )
                    continue
                scan = _read_relation(engine, matcher, relation, scan)
        return _read_large_objects(engine, matcher, scan)

    def backup(self, settings: Settings, out: Path) -> dict[str, Any]:
        from uprof.eventstore import log_anchors, log_identity
        from uprof.services import backup as b

        assert settings.database_url is not None
        engine = self.create_engine(settings.database_url, fsync_each_commit=False)
        try:
            pg_dump = _pg_tool("pg_dump", engine)
            args, env, dbname = _pg_params(settings.database_url)
            excluded = [
                a for t in (*b.KEY_TABLES, "alembic_version") for a in ("--exclude-table", t)
            ]
            # The dump and the manifest's audit head come from one exported snapshot.
            with engine.connect() as conn:
                conn.exec_driver_sql("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                snapshot = conn.exec_driver_sql("SELECT pg_export_snapshot()").scalar_one()
                revision, audit = b._views_revision(conn), b._audit_head(conn)
                # The dump's own snapshot, anchors and events alike (review of 0150,
                # bug JM): what is checked is what is copied, and a damaged log is
                # refused before it is dumped.
                anchors = log_anchors(conn, log_identity(self, engine))
                b.refuse_damaged_copy(conn, anchors)
                result = subprocess.run(
                    [
                        pg_dump,
                        *args,
                        "--format=custom",
                        "--no-owner",
                        "--no-privileges",
                        f"--snapshot={snapshot}",
                        *excluded,
                        "--file",
                        str(out / PG_DUMP),
                        dbname,
                    ],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                conn.exec_driver_sql("COMMIT")
            if result.returncode != 0:
                raise b.BackupError(f"pg_dump failed: {result.stderr.strip()[-2000:]}")
            os.chmod(out / PG_DUMP, 0o600)
        finally:
            engine.dispose()
        return b._manifest(settings, self.name, revision, audit)

    def holds_a_policy(self, settings: Settings) -> bool:
        assert settings.database_url is not None
        engine = self.create_engine(settings.database_url, fsync_each_commit=False)
        try:
            return _holds_a_policy(engine)
        finally:
            engine.dispose()

    def holds_a_deployment(self, settings: Settings, engine: sa.Engine | None = None) -> bool:
        assert settings.database_url is not None
        # The database is the user's to make; a deployment's tables are uprof's: the
        # migrations' version table, the event log's, the policy store's.
        with self._start_engine(settings.database_url, engine) as asked:
            with asked.connect() as conn:
                tables = set(sa.inspect(conn).get_table_names())
        return bool(tables & {"alembic_version", EVENTS_TABLE, f"{POLICY_STORE_NAME}_events"})

    @contextlib.contextmanager
    def _start_engine(self, url: str, engine: sa.Engine | None) -> Iterator[sa.Engine]:
        """``engine`` (the start's, left open: its connection goes back to its pool for
        the start to use next), or an engine of its own for ``url``, disposed after."""
        if engine is not None:
            yield engine
            return
        own = self.create_engine(url, fsync_each_commit=False)
        try:
            yield own
        finally:
            own.dispose()

    def another_programs_store(self, settings: Settings) -> str | None:
        # A database is often shared by several programs, each with its own tables:
        # uprof adds its own beside theirs (docs/cli.md).
        return None

    def why_unwritable(self, settings: Settings, engine: sa.Engine | None = None) -> str | None:
        assert settings.database_url is not None
        # One connection asks the session's setting: a standby's is on, and so is a
        # database's ``default_transaction_read_only`` (bug XQ). A server that does not
        # answer, or has no such database, is left to the start to tell, as before.
        try:
            with self._start_engine(settings.database_url, engine) as asked:
                with asked.connect() as conn:
                    read_only = conn.exec_driver_sql("SHOW transaction_read_only").scalar()
        except sa.exc.SQLAlchemyError:
            return None
        if read_only == "on":
            return (
                "it takes no writes (transaction_read_only is on: a standby, or the "
                "database's default_transaction_read_only)"
            )
        return None

    def database_missing(self, settings: Settings, error: BaseException) -> bool:
        assert settings.database_url is not None
        cause = getattr(error, "orig", None) or error
        sqlstate = getattr(cause, "sqlstate", None)
        if sqlstate is not None:  # the server's answer, where the driver hands it over
            return bool(sqlstate == INVALID_CATALOG_NAME)
        if not isinstance(error, sa.exc.OperationalError):
            return False
        # libpq keeps no SQLSTATE for a refused connection (psycopg's ``sqlstate`` is None
        # there), and its text is the server's, in the server's language: ask the server's
        # catalogue instead, through a database every server has. A server that does not
        # answer there either is the outage it looked like.
        given = sa.engine.make_url(settings.database_url)
        for maintenance in MAINTENANCE_DATABASES:
            engine = sa.create_engine(
                given.set(database=maintenance), poolclass=sa.pool.NullPool, hide_parameters=True
            )
            try:
                with engine.connect() as conn:
                    found = conn.execute(
                        sa.text("SELECT 1 FROM pg_database WHERE datname = :name"),
                        {"name": given.database or "postgres"},
                    ).first()
                return found is None
            except sa.exc.DBAPIError:
                continue  # not allowed there (or not there): the next one
            finally:
                engine.dispose()
        return False

    def restore(self, settings: Settings, src: Path, keep_live_audit: bool) -> None:
        from uprof.services import backup as b

        assert settings.database_url is not None
        engine = self.create_engine(settings.database_url, fsync_each_commit=False)
        try:
            pg_restore = _pg_tool("pg_restore", engine)
            keep_live_policy = _holds_a_policy(engine)
        finally:
            engine.dispose()
        args, env, dbname = _pg_params(settings.database_url)
        dump = src / PG_DUMP
        listing = subprocess.run(
            [pg_restore, "--list", str(dump)], capture_output=True, text=True, env=env
        )
        if listing.returncode != 0:
            raise b.BackupError(f"pg_restore --list failed: {listing.stderr.strip()[-2000:]}")
        lines = listing.stdout.splitlines()
        if keep_live_policy:
            # The live policy stays, as API keys and sign-outs do: a backup taken before a
            # right was revoked must not grant it again (the live log records the
            # revocation). A database without one (a restore into a new database) takes
            # the backup's.
            lines = [line for line in lines if not _names_policy_object(line)]
        if keep_live_audit:
            lines = [line for line in lines if not _names_audit_object(line)]
        toc = settings.data_dir / f".restore-toc-{secrets.token_hex(4)}.list"
        toc.write_text("\n".join(lines) + "\n", encoding="utf-8")
        try:
            result = subprocess.run(
                [
                    pg_restore,
                    *args,
                    "--dbname",
                    dbname,
                    "--clean",
                    "--if-exists",
                    "--single-transaction",
                    "--no-owner",
                    "--no-privileges",
                    "--use-list",
                    str(toc),
                    str(dump),
                ],
                capture_output=True,
                text=True,
                env=env,
            )
        finally:
            toc.unlink(missing_ok=True)
        if result.returncode != 0:
            raise b.BackupError(
                f"pg_restore failed (nothing changed): {result.stderr.strip()[-2000:]}"
            )


#: The open holds of this process (one per kernel; a backup's too), for the event store's
#: own pool to ask before it writes (``refuse_if_stores_lost``).
_HOLDS: weakref.WeakSet[_OpenHold] = weakref.WeakSet()


def refuse_if_stores_lost() -> None:
    """Raise ``StoresLostError`` when a hold of this process was lost (or is found lost
    now): for writers that do not go through the views engine (eventsourcing's psycopg
    pool)."""
    for hold in list(_HOLDS):
        hold.check()


#: What a restore always replaces (``pg_restore --clean`` drops and re-creates it): its
#: identity (``oid``) changes with every restore, and with nothing else.
_RESTORED_TABLE = EVENTS_TABLE


class _OpenHold:
    """The open lock of one process, kept for its life, and what happens when the server
    ends its session while the process lives on.

    The engine's every checkout first looks at the lock's connection: a socket with
    nothing to read is a live idle session (one ``select``, no round trip). Anything to
    read (the server's "terminating connection" and end of stream) is confirmed with a
    query; a session that is gone is replaced by a new one taking the lock again, when
    the stores are still the ones it held (the events table's ``oid``: a restore
    re-creates it). When a restore holds them, or replaced them while nothing held them
    for this process, the process refuses every checkout from then on
    (``StoresLostError``): its caches and its driver's type cache describe stores that
    are gone.
    """

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine
        self._mutex = threading.Lock()
        self._inside = threading.local()
        self._lost = ""
        self._released = False
        conn = _advisory(engine, shared=True)
        #: The connection holding the lock; None once its session was found ended (an
        #: invalidated ``Connection`` would reconnect on its next use, without the lock).
        self._conn: sa.Connection | None = conn
        self._fd = _socket_of(conn)
        self._identity = self._read_identity(conn)
        #: The lock's session is ``_fd``'s and the stores are noted: the fast path holds.
        self._settled = self._identity is not None
        sa.event.listen(engine, "checkout", self._on_checkout)
        _HOLDS.add(self)

    def check(self) -> None:
        """What every checkout of the engine runs (the module docstring of the class)."""
        self._on_checkout()

    def _on_checkout(self, *_: object) -> None:
        if getattr(self._inside, "busy", False) or self._released:
            return  # the hold's own checkouts
        if self._lost:
            raise StoresLostError(self._lost)
        if self._settled and not _readable(self._fd):
            return  # the common case: a live session, the stores noted
        with self._mutex:
            self._inside.busy = True
            try:
                self._check()
            finally:
                self._inside.busy = False

    def _check(self) -> None:
        if self._lost:
            raise StoresLostError(self._lost)
        if self._released:
            return
        if self._conn is not None and self._alive(self._conn):
            if self._identity is None:  # the tables are made after the lock is taken
                self._identity = self._read_identity(self._conn)
            self._settled = self._identity is not None
            return
        self._settled = False  # until a new session holds the lock: every checkout waits
        if self._conn is not None:
            with contextlib.suppress(sa.exc.DBAPIError):
                self._conn.invalidate()
            self._conn = None
        try:
            conn = _advisory(self._engine, shared=True)
        except StoresInUseError:
            self._lost = (
                "this process's hold on the database ended (its session was cut) and a "
                "restore holds it now; restart this process once the restore has finished"
            )
            raise StoresLostError(self._lost) from None
        identity = self._read_identity(conn)
        if identity != self._identity:
            _unlock(conn)
            self._lost = (
                "this process's hold on the database ended (its session was cut) and the "
                "stores were replaced since (a restore); restart this process"
            )
            raise StoresLostError(self._lost)
        self._conn, self._fd = conn, _socket_of(conn)
        self._settled = identity is not None

    def _alive(self, conn: sa.Connection) -> bool:
        if not _readable(self._fd):
            return True
        try:  # something came: a notice, or the end of the session
            conn.execute(sa.text("SELECT 1")).scalar_one()
            conn.commit()
        except sa.exc.DBAPIError:
            return False
        return True

    @staticmethod
    def _read_identity(conn: sa.Connection) -> int | None:
        found = conn.execute(
            sa.text("SELECT CAST(to_regclass(:t) AS oid)"), {"t": _RESTORED_TABLE}
        ).scalar_one()
        conn.commit()
        return None if found is None else int(found)

    def release(self) -> None:
        with self._mutex:
            if self._released:
                return
            self._released = True
        _HOLDS.discard(self)
        with contextlib.suppress(sa.exc.InvalidRequestError):
            sa.event.remove(self._engine, "checkout", self._on_checkout)
        if not self._lost and self._conn is not None:
            _unlock(self._conn)


def _unlock(conn: sa.Connection) -> None:
    try:
        conn.execute(sa.text("SELECT pg_advisory_unlock_shared(:k)"), {"k": OPEN_LOCK_KEY})
        conn.commit()
        conn.close()
    except sa.exc.DBAPIError:
        conn.invalidate()  # the session, and its lock, end with the connection


def _socket_of(conn: sa.Connection) -> int:
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None
    return int(dbapi.fileno())


def _readable(fd: int) -> bool:
    """Whether the server sent anything on an idle connection (it sends nothing unasked
    but its notices and the end of a session it terminates)."""
    try:
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
        return True  # closed: the session is gone


def _advisory(engine: sa.Engine, *, shared: bool) -> sa.Connection:
    """A connection holding the open lock (shared or exclusive), taken without waiting."""
    fn = "pg_try_advisory_lock_shared" if shared else "pg_try_advisory_lock"
    conn = engine.connect()
    try:
        got = conn.execute(sa.text(f"SELECT {fn}(:k)"), {"k": OPEN_LOCK_KEY}).scalar_one()
        conn.commit()
    except BaseException:
        conn.close()
        raise
    if got:
        return conn
    conn.close()
    database = engine.url.database
    if shared:
        raise StoresInUseError(
            f"a restore holds the database {database}; start again once it has finished"
        )
    raise StoresInUseError(
        f"another uprof process has the database {database} open; stop every uprof process "
        "on this deployment (servers, workers, MCP, on every host) before a restore"
    )


def _quoted(name: str) -> str:
    """An identifier from the catalog, quoted for SQL."""
    return '"' + name.replace('"', '""') + '"'


#: Every relation that stores rows, in every schema but the server's own (bug OZ: the
#: scan listed the default schema's tables only, so a copy an operator kept in a schema
#: of its own, or a materialized view built from the memories, was never read). Tables
#: (partitions included, each once: a partitioned parent holds no rows itself),
#: materialized views, and foreign tables (``'f'``: listed, never read, bug PU); views
#: store nothing. Per column: "bytea" or "bytea[]" when its values are bytes, looked
#: through domains and arrays (bug PA); "record" when bytes are inside a composite type
#: (read as text, whose bytea fields print as hex: ``_hex_bytes``, bug PU); else NULL
#: (read as text).
_STORED_RELATIONS = """
WITH RECURSIVE base(oid, root, arrays, composite) AS (
    SELECT a.atttypid, a.atttypid, 0, false FROM pg_attribute a GROUP BY a.atttypid
  UNION ALL
    SELECT CASE t.typtype WHEN 'd' THEN t.typbasetype WHEN 'c' THEN f.atttypid
                ELSE t.typelem END,
           b.root,
           b.arrays + CASE WHEN t.typtype IN ('d', 'c') THEN 0 ELSE 1 END,
           b.composite OR t.typtype = 'c'
    FROM base b JOIN pg_type t ON t.oid = b.oid
    LEFT JOIN pg_attribute f ON t.typtype = 'c' AND f.attrelid = t.typrelid
         AND f.attnum > 0 AND NOT f.attisdropped
    WHERE t.typtype = 'd' OR (t.typcategory = 'A' AND t.typelem <> 0)
       OR (t.typtype = 'c' AND f.atttypid IS NOT NULL)
)
SELECT c.oid, c.relkind, n.nspname, c.relname, a.attname,
       (SELECT CASE WHEN b.composite THEN 'record' WHEN b.arrays = 0 THEN 'bytea'
                    ELSE 'bytea[]' END
        FROM base b WHERE b.root = a.atttypid AND b.oid = 'bytea'::regtype
        ORDER BY b.composite DESC LIMIT 1)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE c.relkind IN ('r', 'm', 'f')
  AND n.nspname <> 'information_schema' AND left(n.nspname, 3) <> 'pg_'
ORDER BY n.nspname, c.relname, a.attnum
"""


#: SQLSTATEs of a relation the scan lists but cannot read: no privilege on it or its
#: schema, gone since the listing (undefined table, invalid schema name), a large object
#: gone since its listing (undefined object).
_UNREADABLE = {"42501", "42P01", "3F000", "42704"}

#: A bytea printed as text inside a composite value: ``\x`` and its bytes in hex.
_HEX_BYTES = re.compile(r"\\x((?:[0-9a-fA-F]{2})+)")


def _hex_bytes(text: str) -> Iterator[bytes]:
    """The bytes of every bytea a composite value's text holds (bug PU: ``::text``
    prints them as hex, where no term's spelling is). Text that only looks so adds bytes
    to search, never fewer."""
    for run in _HEX_BYTES.finditer(text):
        yield bytes.fromhex(run.group(1))


@dataclass(frozen=True)
class _Relation:
    oid: int
    kind: str  # pg_class.relkind
    sql: str  # "schema"."relation"
    shown: str  # its name in a finding
    columns: list[tuple[str, str | None]]


def _stored_relations(engine: sa.Engine) -> list[_Relation]:
    """Every relation ``_STORED_RELATIONS`` lists, with how to read each column.

    A finding names a relation of the connection's default schema by its name alone, as
    before; one of another schema as ``schema.relation``."""
    relations: dict[int, _Relation] = {}
    with engine.connect() as conn:
        default = conn.exec_driver_sql("SELECT current_schema()").scalar_one()
        for oid, kind, schema, name, column, read in conn.exec_driver_sql(_STORED_RELATIONS):
            if oid not in relations:
                relations[oid] = _Relation(
                    oid,
                    kind,
                    f"{_quoted(schema)}.{_quoted(name)}",
                    name if schema == default else f"{schema}.{name}",
                    [],
                )
            relations[oid].columns.append((column, read))
    return list(relations.values())


#: Listings of the relations per scan (``scan_tables``): the first, one after reading it,
#: and one that only names what is new since as not read.
_LISTINGS = 3


def _read_relation(
    engine: sa.Engine, matcher: Any, relation: _Relation, scan: TableScan
) -> TableScan:
    """Read one relation's rows in a transaction of its own; hits and tables added."""
    from uprof.services.residue_files import ROWS_PER_COLUMN

    # bytea read as bytes, also inside arrays and domains (bug PA: SQLAlchemy's type name
    # chose; a bytea[] came back as a list the matcher skipped, a domain over bytea as hex
    # text); every other column as the text it prints as, the bytes inside a composite
    # decoded from its hex (bug PU).
    columns = relation.columns
    values = ", ".join(
        f"{_quoted(name)}::{kind}" if kind in ("bytea", "bytea[]") else f"{_quoted(name)}::text"
        for name, kind in columns
    )
    found: dict[tuple[str, str], int] = {}
    hits = []
    try:
        with engine.connect() as conn:
            rows = conn.execution_options(stream_results=True, yield_per=1_000)
            for ctid, *row in rows.exec_driver_sql(
                f"SELECT ctid::text, {values} FROM {relation.sql}"
            ):
                for (name, kind), value in zip(columns, row, strict=True):
                    terms = matcher.terms_in(value)
                    if kind == "record" and value is not None:
                        terms += [t for b in _hex_bytes(value) for t in matcher.terms_in(b)]
                    for term in dict.fromkeys(terms):
                        seen = found.get((name, term), 0)
                        if seen < ROWS_PER_COLUMN:
                            found[(name, term)] = seen + 1
                            hits.append(TermHit(relation.shown, name, ctid, term))
    except sa.exc.DBAPIError as error:
        # Every schema is read now (OZ): one the deployment's role may not read (an
        # extension's), or a relation renamed or dropped since the listing, is named as not
        # read, never passed over; any other error fails the scan.
        if getattr(error.orig, "sqlstate", None) not in _UNREADABLE:
            raise
        return TableScan(
            scan.tables + 1,
            scan.hits,
            [*scan.unreadable, (relation.shown, str(error.orig).strip().splitlines()[0])],
        )
    return TableScan(scan.tables + 1, [*scan.hits, *hits], scan.unreadable)


#: Bytes of a large object per read (``lo_get``), as the file scan's windows.
_LARGE_OBJECT_READ = 1 << 20


def _read_large_objects(engine: sa.Engine, matcher: Any, scan: TableScan) -> TableScan:
    """Every large object (``pg_largeobject``, a catalog table the relation listing
    leaves out with the server's own; bug PU): read in windows overlapping by the
    longest needle, as the file scan reads a file; each object in a transaction of its
    own. One this role may not read (or gone since the listing) is named as not read."""
    with engine.connect() as conn:
        oids = list(
            conn.exec_driver_sql("SELECT oid FROM pg_largeobject_metadata ORDER BY oid").scalars()
        )
    if not oids:
        return scan
    hits, unreadable = list(scan.hits), list(scan.unreadable)
    for oid in oids:
        shown = f"large object {oid}"
        try:
            with engine.connect() as conn:
                found: set[str] = set()
                offset, tail = 0, b""
                while True:
                    chunk = conn.execute(
                        sa.text("SELECT lo_get(:oid, :at, :n)"),
                        {"oid": oid, "at": offset, "n": _LARGE_OBJECT_READ},
                    ).scalar_one()
                    window = tail + bytes(chunk)
                    for term in matcher.terms_in(window):
                        if term not in found:
                            found.add(term)
                            hits.append(
                                TermHit(shown, "data", f"from byte {offset - len(tail)}", term)
                            )
                    if len(chunk) < _LARGE_OBJECT_READ:
                        break
                    offset += len(chunk)
                    tail = window[-matcher.overlap :]
        except sa.exc.DBAPIError as error:
            if getattr(error.orig, "sqlstate", None) not in _UNREADABLE:
                raise
            unreadable.append((shown, str(error.orig).strip().splitlines()[0]))
    return TableScan(scan.tables + 1, hits, unreadable)


def _pg_params(url: str) -> tuple[list[str], dict[str, str], str]:
    """pg_dump's and pg_restore's arguments, environment and database for ``url``, as
    the engines connect (``connection_parts``: the query's host and port too, bug YA)."""
    parts = connection_parts(url)
    args = [f"--{flag}={parts[part]}" for part, flag in _TOOL_FLAGS if parts.get(part)]
    env = {**os.environ}
    if parts.get("password"):
        env["PGPASSWORD"] = parts["password"]
    return args, env, parts["dbname"]


#: ``connection_parts``'s names and the client tools' options for them.
_TOOL_FLAGS = (("host", "host"), ("port", "port"), ("user", "username"))


def _pg_tool(name: str, engine: sa.Engine) -> str:
    """The path of pg_dump/pg_restore, refused if older than the server (it cannot read it)."""
    from uprof.services import backup as b

    path = shutil.which(name)
    if path is None:
        raise b.BackupError(f"{name} is not installed; install the PostgreSQL client tools")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"(\d+)(?:\.(\d+))?", out)
    tool_major = int(match.group(1)) if match else 0
    with engine.connect() as conn:
        server_num = int(conn.execute(sa.text("SHOW server_version_num")).scalar_one())
    if tool_major < server_num // 10000:
        raise b.BackupError(
            f"{name} {tool_major} is older than the server ({server_num // 10000}); "
            f"use the {name} of PostgreSQL {server_num // 10000} or newer"
        )
    return path


def _names_audit_object(toc_line: str) -> bool:
    """A pg_restore TOC line for an audit table, its indexes, constraints, triggers or the
    append-only trigger function (every one of them has ``audit`` in its name)."""
    if toc_line.startswith(";"):
        return False
    return any("audit" in word for word in toc_line.split()[3:])


def _holds_a_policy(engine: sa.Engine) -> bool:
    """Whether the database's policy store holds a policy (any recorded change)."""
    table = f"{POLICY_STORE_NAME}_events"
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table(table):
            return False
        return conn.execute(sa.text(f'SELECT EXISTS (SELECT 1 FROM "{table}")')).scalar() is True


def _names_policy_object(toc_line: str) -> bool:
    """A pg_restore TOC line for a table of the policy store (eventsourcing's
    ``policies_events`` and ``policies_snapshots``), its sequence, default, indexes or
    constraints (every one of them is named after the store: ``policies_``)."""
    if toc_line.startswith(";"):
        return False
    prefix = f"{POLICY_STORE_NAME}_"
    return any(word.startswith(prefix) for word in toc_line.split()[3:])


#: Typed as the protocol, so the type checker holds the class to all of it.
POSTGRES: Backend = PostgresBackend()


#: The engine named locks take their connections from, per engine (``_lock_engine``).
_LOCK_ENGINES: weakref.WeakKeyDictionary[sa.Engine, sa.Engine] = weakref.WeakKeyDictionary()
_LOCK_ENGINES_MUTEX = threading.Lock()
#: SQLSTATE of a wait that ``lock_timeout`` ended (``lock_not_available``).
_LOCK_NOT_AVAILABLE = "55P03"
#: PostgreSQL's SQLSTATE for a statement ended by a cancel request (query_canceled).
_QUERY_CANCELED = "57014"


@contextlib.contextmanager
def _cancelled_on_stop(
    conn: sa.Connection, stopping: Callable[[], bool] | None
) -> Iterator[Callable[[], bool]]:
    """While the block runs a blocking statement on ``conn``, look at ``stopping`` every
    ``SCHEMA_LOCK_STOP_CHECK_S`` from a thread of its own and cancel the statement once
    it says stop (psycopg's ``cancel_safe``, the documented way from another thread).
    Yields whether it cancelled. The wait for the lock thus stays in PostgreSQL's queue
    while the process looks for stops: leaving the queue to look lost the turn (bug SU)."""
    if stopping is None:
        yield lambda: False
        return
    driver = conn.connection.driver_connection
    done, cancelled = threading.Event(), threading.Event()

    def watch() -> None:
        while not done.wait(SCHEMA_LOCK_STOP_CHECK_S):
            if stopping():
                cancelled.set()
                driver.cancel_safe()  # type: ignore[union-attr]
                return

    watcher = threading.Thread(target=watch, name="uprof-schema-lock-stop", daemon=True)
    watcher.start()
    try:
        yield cancelled.is_set
    finally:
        done.set()
        watcher.join()


#: Idle lock sessions kept for reuse; more are opened when more locks are held at once.
LOCK_POOL_SIZE = 2


def _advisory_key(name: str) -> int:
    """``named_lock``'s advisory key of ``name``: 64 bits of a sha256 (as in 0158)."""
    digest = hashlib.sha256(f"uprof/named-lock/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _poll_advisory(
    conn: sa.Connection,
    try_function: str,
    key: int,
    deadline: float,
    stopping: Callable[[], bool] | None = None,
) -> bool:
    """``_take_advisory`` (its docstring says how), the session dropped if anything but
    the database ends the wait. A signal handler of the program's own that raises
    (``uprof.backends._stops_on_default_signals`` leaves such a handler alone) raises
    inside the blocking query: psycopg cancels the query for ``KeyboardInterrupt`` and
    ``SystemExit`` only, so the session was left in it, queued for the lock, and the
    ROLLBACK on leaving the connection failed ("another command is already in
    progress"), that error replacing the program's own exception (bug PG). Dropped, the
    session's request ends with it, and a lock granted to it is released."""
    try:
        return _take_advisory(conn, try_function, key, deadline, stopping)
    except sa.exc.SQLAlchemyError:
        raise
    except BaseException:
        conn.invalidate()
        raise


def _take_advisory(
    conn: sa.Connection,
    try_function: str,
    key: int,
    deadline: float,
    stopping: Callable[[], bool] | None,
) -> bool:
    """Take ``try_function``'s lock (``pg_try_advisory_lock`` or its ``_shared`` form) on
    ``key`` by ``deadline`` (monotonic): True once held, False when the deadline passed,
    or when ``stopping()`` said the process was asked to stop (the wait cancelled,
    ``_cancelled_on_stop``: it stays in the queue until then, bug SU).

    One try without blocking; then, while time is left, the blocking form under a
    ``lock_timeout`` of the time left, so that this session waits in PostgreSQL's queue
    for the lock: a release grants it to the first session queued. Tries every few
    milliseconds lost every release to a holder that takes the lock again at once (a
    rebuild after a rebuild): ten ``uprof backup`` starts beside a looping rebuild took
    234 s where blocking waits took 42 s (decision 0180's polls). The wait still ends by
    the deadline, so a stopped holder is still reported and a stop still seen."""
    if stopping is None or deadline <= time.monotonic():
        held = bool(
            conn.execute(sa.text(f"SELECT {try_function}(:key)"), {"key": key}).scalar_one()
        )
        conn.commit()
        if held or deadline <= time.monotonic():
            return held
    # A wait that looks for stops (the schema lock's) queues at once: the moment between
    # a failed try and the queue let a holder taking the lock again at once by (bug SU).
    left = deadline - time.monotonic()
    # set_config(..., true): for this transaction only, gone at its commit or rollback.
    conn.execute(
        sa.text("SELECT set_config('lock_timeout', :ms, true)"),
        {"ms": f"{max(1, int(left * 1000))}ms"},
    )
    try:
        with _cancelled_on_stop(conn, stopping) as cancelled:
            conn.execute(
                sa.text(f"SELECT {try_function.replace('pg_try_', 'pg_', 1)}(:key)"),
                {"key": key},
            )
    except sa.exc.OperationalError as error:
        conn.rollback()
        ended_by = getattr(error.orig, "sqlstate", None)
        if ended_by != _LOCK_NOT_AVAILABLE and not (ended_by == _QUERY_CANCELED and cancelled()):
            raise
        # The server may grant the lock in the moment the timeout (or the cancel) comes:
        # it raises 55P03 all the same and keeps the grant, and a session lock outlives the
        # rollback. Taken for a failed try, the session held the lock unknown to uprof:
        # a later take and its one release left it held on a pooled connection, and
        # every other process waited for it (review of 0191). Whether it holds it is the
        # server's to say.
        return _holds_advisory(conn, key, shared=try_function.endswith("_shared"))
    conn.commit()
    return True


def _holds_advisory(conn: sa.Connection, key: int, *, shared: bool) -> bool:
    """Whether this session holds the advisory lock ``key`` (shared or exclusive), as
    ``pg_locks`` shows a bigint key: its high and low 32 bits, ``objsubid`` 1."""
    held = conn.execute(
        sa.text(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND pid = pg_backend_pid() AND objsubid = 1 AND mode = :mode "
            "AND classid::bigint = :high AND objid::bigint = :low)"
        ),
        {
            "mode": "ShareLock" if shared else "ExclusiveLock",
            "high": (key >> 32) & 0xFFFFFFFF,
            "low": key & 0xFFFFFFFF,
        },
    ).scalar_one()
    conn.commit()
    return bool(held)


#: A schema lock holder's session name: ``uprof <pid> <since> <host> <purpose>``, cut to
#: PostgreSQL's 63 bytes (``NAMEDATALEN``): the numbers first, so that a cut (a long
#: host name) shortens only the words.
_HOLDER_NAME = re.compile(r"^uprof (\d{1,10}) (\d{1,12}) ?(\S*) ?(.*)$")


def _holder_name(record: dict[str, Any]) -> str:
    name = f"uprof {record['pid']} {int(record['since'])} {record['host']} {record['purpose']}"
    return name.encode()[:63].decode(errors="ignore")


def _schema_lock_holder_of(conn: sa.Connection) -> str:
    """The session holding the schema lock, for a waiter: its backend pid, and the
    uprof process behind it as its session name says (``_holder_name``); a session
    not of uprof (psql, a process of an earlier release) is named by its backend pid
    and application name. The lock key is split as pg_locks shows a bigint key."""
    row = conn.execute(
        sa.text(
            "SELECT l.pid, a.application_name FROM pg_locks l "
            "LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
            "AND l.classid::bigint = :high AND l.objid::bigint = :low "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ),
        {"high": SCHEMA_LOCK_KEY >> 32, "low": SCHEMA_LOCK_KEY & 0xFFFFFFFF},
    ).first()
    conn.commit()
    if row is None:
        return "a session that has just let go"
    backend_pid, name = int(row[0]), row[1] or ""
    parsed = _HOLDER_NAME.match(name)
    if parsed is None:
        shown = name[:63] if name.isprintable() else repr(name[:63])
        return f"PostgreSQL session {backend_pid} (application_name {shown!r}), not a uprof start"
    pid, since, host, purpose = parsed.groups()
    return described_holder(
        {"pid": int(pid), "host": host, "since": int(since), "purpose": purpose},
        backend_pid=backend_pid,
    )


def _lock_engine(engine: sa.Engine) -> sa.Engine:
    """An engine of ``engine``'s database for ``named_lock`` alone, disposed with it.

    Its pool has no upper bound (``max_overflow=-1``): each lock held or waited for is
    one session, and a lock must never wait for a connection that the work it guards
    holds (bug KD). The bound is the number of guarded writes running at once, each
    of which is already a request the server admitted."""
    with _LOCK_ENGINES_MUTEX:
        locks = _LOCK_ENGINES.get(engine)
        if locks is None:
            locks = sa.create_engine(
                engine.url,
                pool_pre_ping=True,
                pool_size=LOCK_POOL_SIZE,
                max_overflow=-1,
                hide_parameters=True,
            )
            _LOCK_ENGINES[engine] = locks
            sa.event.listen(engine, "engine_disposed", lambda _disposed: locks.dispose())
        return locks
