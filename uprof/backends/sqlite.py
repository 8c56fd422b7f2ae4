"""SQLite, the embedded backend: one file per store in the data folder (and the key folder).

``events.sqlite`` (the eventsourcing log), ``views.sqlite`` (read models and audit log),
``policies.sqlite`` (the policy store) beside it, and ``keys.sqlite`` in the key folder,
apart from the data (decision 0012). eventsourcing's table names are fixed on SQLite, so
each application has its own file (FIELD-NOTES 2.2).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import socket
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

import sqlalchemy as sa

from audit.lockfile import check_data_folder, make_lock_folder, open_lock_file
from uprof.backends import (
    Backend,
    LockFileAccessError,
    StorageLayout,
    StoresInUseError,
    TableScan,
    described_holder,
    policy_recorders,
    schema_lock_holder,
    upsert_from_with,
    upsert_with,
    wait_for_schema_lock,
)

if TYPE_CHECKING:
    from uprof.settings import Settings

#: The SQLite file of the policy store (its own application, so its own file).
POLICY_STORE_FILE = "policies.sqlite"
#: The views store (read models, audit log) in the data folder.
VIEWS_STORE_FILE = "views.sqlite"
#: The stores of a deployment's data folder (one of them there: a deployment is).
DATA_STORE_FILES = (VIEWS_STORE_FILE, "events.sqlite", POLICY_STORE_FILE)
#: The key store's file, in the key folder (``uprof.crypto.keydir.KEYS_DB_FILE``).
KEY_STORE_FILE = "keys.sqlite"
#: Tables one of the data folder's files holds when it is a deployment's: the migrations'
#: version table (views), the event logs' table (events, policies), the audit log's.
#: The same question PostgreSQL's ``holds_a_deployment`` asks of the database.
DEPLOYMENT_TABLES = frozenset({"alembic_version", "stored_events", "audit_entries"})
#: The files of a backup, views first: the views' projection position must never be
#: ahead of the log.
SQLITE_FILES = ("views.sqlite", "events.sqlite")
#: Beside a database file: the file whose flock orders schema changes (``schema_lock``).
SCHEMA_LOCK_SUFFIX = ".schema-lock"
#: Beside a lock file: its turnstile, held by the process that waits next (``_Turns``);
#: it exists only while one waits.
SCHEMA_TURN_SUFFIX = ".schema-turn"
NAMED_TURN_SUFFIX = ".turn"
#: How long a waiter stays behind the turnstile's holder before it also tries the lock
#: itself. A live holder tries every ``NAMED_LOCK_POLL_S`` and leaves the turnstile the
#: moment it has the lock; one stopped there (SIGSTOP) kept every later waiter from a
#: free lock until their bound gave up (0191 "Left", bug PK).
TURN_PATIENCE_S = 1.0
#: Beside the views database: the file every running process holds a shared flock of
#: (``hold_open``) and ``uprof restore`` an exclusive one (``stores_alone``).
OPEN_LOCK_SUFFIX = ".open-lock"
#: How often ``named_lock`` tries again while another process holds it.
NAMED_LOCK_POLL_S = 0.05
#: The table eventsourcing keeps the profiles log's events in (the log has its own file).
EVENTS_TABLE = "stored_events"


#: How long a connection waits for another's lock before "database is locked".
BUSY_TIMEOUT_MS = 30_000


def _pragmas(dbapi_connection: Any, _record: Any, *, synchronous: str = "NORMAL") -> None:
    cursor = dbapi_connection.cursor()
    # Deleted rows must not linger in free pages (FIELD-NOTES §4); never rely on the
    # build default. WAL lets readers run beside the projection writer.
    cursor.execute("PRAGMA secure_delete=ON")
    _into_wal(dbapi_connection)
    cursor.execute(f"PRAGMA synchronous={synchronous}")
    cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _pragmas_full(dbapi_connection: Any, record: Any) -> None:
    _pragmas(dbapi_connection, record, synchronous="FULL")


def _into_wal(connection: sqlite3.Connection) -> None:
    """Put the connection's database into WAL mode; a no-op, taking no lock, once it is.

    The switch of a database not yet in WAL (a new file) needs the file's exclusive lock,
    and while another connection holds its write lock SQLite refuses at once, "database is
    locked", without the busy wait: waiting could deadlock with a holder that wants to
    upgrade in turn. Processes starting at once on a new store all switch each new file,
    and one of them failed its start (bug KA). The other holder is another switch (or a
    short write) that ends in milliseconds, and once a switch has committed the file's
    header says WAL and every later switch is a no-op: so the refused switch is tried
    again (``WAL_SWITCH``). Every switch uprof makes comes here: its engines' connections
    (``_pragmas``) and the files it hands to eventsourcing (``_file_into_wal``).
    """
    from domain.errors import StoreBusyError
    from uprof.retry import WAL_SWITCH

    def switch() -> None:
        try:
            connection.execute("PRAGMA journal_mode=WAL").fetchall()
        except sqlite3.OperationalError as error:
            if SQLITE.is_transient_lock(error):
                raise StoreBusyError(
                    "another process held the write lock of a new SQLite database while "
                    "this one switched it into WAL mode"
                ) from error
            raise

    WAL_SWITCH.call(switch)


def _holds_uprof_tables(path: Path) -> bool:
    """Whether the SQLite file ``path`` holds one of ``DEPLOYMENT_TABLES``, read without
    writing (``mode=ro``); True where it cannot be read as SQLite at all: a store file
    overwritten or cut short is the deployment's, damaged, and the start says so (exit
    7), where "no deployment" (exit 8) would send its operator to make a new one."""
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error:
        return True
    try:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    except sqlite3.Error:
        return True
    finally:
        conn.close()
    return bool(names & DEPLOYMENT_TABLES)


def _table_names(path: Path) -> set[str] | None:
    """The tables of the SQLite file ``path``, read without writing (``mode=ro``); None
    where it cannot be read as SQLite (damage: the start's to name)."""
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error:
        return None
    try:
        return {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def _file_into_wal(database: Path) -> Path:
    """Switch ``database`` into WAL mode before eventsourcing opens it (creating it if it
    is new), and return it.

    eventsourcing's connection pool switches a file itself, once, without waiting on a
    refused switch (bug KA, ``_into_wal``); a file already in WAL it leaves alone. Through
    the driver only, never a plain open of the file (FIELD-NOTES 8.1).
    """
    connection = sqlite3.connect(database, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        _into_wal(connection)
    finally:
        connection.close()
    return database


#: How long an erasure's WAL truncation is tried (the connections' busy timeout), and
#: the pause between tries while another process's checkpoint runs.
FOLD_TIMEOUT_S = 30.0
#: How long one try may wait (holding the file's write lock) for readers to go, and the
#: pause after it: longer than the try, and than the longest sleep of a waiting writer's
#: busy handler (100 ms), so that waiting writers always get their turn (bug CT).
FOLD_TRY_MS = 100
FOLD_RETRY_S = 0.15
#: SQLite's primary result codes for "another connection holds the lock" (BUSY, LOCKED).
_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
#: SQLite's primary result codes for "the database did not answer": locked past the wait,
#: a file that cannot be opened, read or written (I/O, a full or read-only disk), memory.
#: Not SQLITE_ERROR: the driver raises ``OperationalError`` for it too, but it says a
#: statement cannot run (no such table or column, a syntax error), which waiting does not
#: mend (review of 0182, bug NR).
_OUTAGE_CODES = _BUSY_CODES | frozenset(
    {
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_INTERRUPT,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PROTOCOL,
    }
)


def sqlite_did_not_answer(error: sqlite3.Error) -> bool:
    """Whether SQLite's ``error`` says the database did not answer (an outage), rather
    than that the statement or the stored data is at fault. An error without a code is
    not taken for an outage."""
    code = getattr(error, "sqlite_errorcode", None)
    # An extended code keeps its primary code in the low byte.
    return isinstance(code, int) and code & 0xFF in _OUTAGE_CODES


def type_affinity(declared: str) -> str:
    """SQLite's affinity of a column declared ``declared`` (sqlite.org, "Datatypes In
    SQLite", 3.1: the first rule that matches)."""
    upper = declared.upper()
    if "INT" in upper:
        return "INTEGER"
    if any(word in upper for word in ("CHAR", "CLOB", "TEXT")):
        return "TEXT"
    if "BLOB" in upper or not upper.strip():
        return "BLOB"
    if any(word in upper for word in ("REAL", "FLOA", "DOUB")):
        return "REAL"
    return "NUMERIC"


#: The affinities under which SQLite keeps what eventsourcing writes as it was written
#: (it makes TEXT, INTEGER, TEXT, BLOB): SQLite converts a value on write by its column's
#: affinity, so a version under TEXT reads back as the text "1" (the library's
#: ``version + 1`` fails), and a stream id of hex digits alone under INTEGER or NUMERIC as
#: a number. A blob is never converted: the state fits any.
_KEPT_AS_WRITTEN = {
    "originator_id": frozenset({"TEXT", "BLOB"}),
    "topic": frozenset({"TEXT", "BLOB"}),
    "application_name": frozenset({"TEXT", "BLOB"}),
    "originator_version": frozenset({"INTEGER", "NUMERIC", "BLOB"}),
    "notification_id": frozenset({"INTEGER", "NUMERIC", "BLOB"}),
}


def column_type_fits(column: str, declared: str) -> bool:
    """``SQLiteBackend.column_type_fits``, for the recorders too (no backend there)."""
    kept = _KEPT_AS_WRITTEN.get(column)
    return kept is None or type_affinity(declared) in kept


class SQLiteBackend:
    name = "sqlite"
    backup_files: tuple[str, ...] = SQLITE_FILES
    persistence_module = "eventsourcing.sqlite"
    guarded_recorder_topic = "uprof.recorders:GuardedSQLiteProcessRecorder"
    snapshot_recorder_topic = "uprof.recorders:RowsCheckedSQLiteRecorder"
    checked_application_recorder_topic = "uprof.recorders:RowsCheckedSQLiteApplicationRecorder"
    writes_rows_by_position = True
    alters_in_batches = True  # SQLite's ALTER TABLE cannot change or drop most things
    key_folder_stores: tuple[str, ...] = (KEY_STORE_FILE,)

    def check_database_url(self, url: str) -> str:
        raise ValueError(
            "database_url must be a PostgreSQL URL (postgresql+psycopg://...); "
            "leave it unset for the embedded SQLite default"
        )

    def layout(self, settings: Settings) -> StorageLayout:
        data = settings.data_dir
        data.mkdir(parents=True, exist_ok=True)
        # Its stores swapped under a running deployment would take what it writes (SK).
        check_data_folder(data)
        keys = settings.key_path
        keys.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Handed to eventsourcing, which would switch it into WAL without waiting (bug KA).
        events = _file_into_wal(data / "events.sqlite")
        return StorageLayout(
            views_url=f"sqlite:///{data / VIEWS_STORE_FILE}",
            keys_url=f"sqlite:///{keys / KEY_STORE_FILE}",
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
            # Handed to eventsourcing, which would switch it into WAL without waiting (KA).
            "SQLITE_DBNAME": str(_file_into_wal(settings.data_dir / POLICY_STORE_FILE)),
            "SQLITE_LOCK_TIMEOUT": "30",
            **policy_recorders(self),
        }

    def create_engine(self, url: str, *, fsync_each_commit: bool) -> sa.Engine:
        engine = sa.create_engine(url, connect_args={"timeout": 30}, hide_parameters=True)
        sa.event.listen(engine, "connect", _pragmas_full if fsync_each_commit else _pragmas)
        return engine

    @contextlib.contextmanager
    def schema_lock(self, engine: sa.Engine, *, wait_s: float, purpose: str) -> Iterator[None]:
        # SQLite serialises each write, not alembic's "no version table yet? create it":
        # processes starting at once on a new store both decide to create it and all but
        # one fail ("table alembic_version already exists"). An exclusive flock on a file
        # of its own beside the database orders them. Never a lock on the database file:
        # closing a descriptor of it would drop this process's SQLite locks (FIELD-NOTES 8.1).
        database = engine.url.database
        if not database or database == ":memory:" or engine.url.query.get("mode") == "memory":
            yield
            return
        fd = open_lock_file(f"{database}{SCHEMA_LOCK_SUFFIX}")
        try:
            # Everything opened after the lock file is closed by this ``finally``: the
            # turnstile was opened before it, and a turnstile refused leaked the lock
            # file's descriptor on every start that met it (bug PH).
            turns = _Turns(f"{database}{SCHEMA_TURN_SUFFIX}", lambda: _flocked(fd, shared=False))
            try:
                # Tried without blocking: a holder stopped (not killed) keeps its flock,
                # and a blocking wait hung every other start for ever, saying nothing.
                wait_for_schema_lock(
                    turns.take_by,
                    lambda: _schema_lock_holder_of(fd) + turns.waiting_ahead(),
                    store=f"the SQLite database {database}",
                    wait_s=wait_s,
                )
            finally:
                turns.close()  # a wait that ended without the lock leaves the turnstile
            # Who holds it, for the processes waiting (written once the flock is ours,
            # so a waiter never reads a record that a non-holder is writing).
            _write_holder_record(fd, purpose)
            try:
                yield
            finally:
                os.ftruncate(fd, 0)  # not held any more: nobody to name
        finally:
            os.close(fd)  # releases the flock

    @contextlib.contextmanager
    def migration_transaction(self, engine: sa.Engine) -> Iterator[sa.Connection]:
        # pysqlite opens a transaction only before DML and runs DDL outside one: each
        # CREATE TABLE of a migration committed on its own, so a start killed midway left
        # a table without its revision, and every later start failed "table ... already
        # exists" (bug JA). With the driver's own transaction handling off, one explicit
        # BEGIN IMMEDIATE holds the whole upgrade (DDL is transactional in SQLite), and
        # takes the write lock first: the revision alembic reads is the one it changes.
        with engine.connect() as conn:
            driver = conn.connection.driver_connection
            assert driver is not None
            saved = driver.isolation_level
            driver.isolation_level = None
            try:
                with conn.begin():
                    conn.exec_driver_sql("BEGIN IMMEDIATE")
                    yield conn
            finally:
                driver.isolation_level = saved  # the pooled connection as it was

    @contextlib.contextmanager
    def named_lock(
        self,
        engine: sa.Engine,
        name: str,
        *,
        wait_s: float,
        previous_release_shared: str | None = None,
    ) -> Iterator[bool]:
        # An exclusive flock of a file of its own (never the database file: FIELD-NOTES
        # 8.1), one file per name in a folder beside the database, named by a sha256 of
        # the name (a long hash: two names never share a file, bug KC); the system drops
        # the flock when the holder dies. Tried without blocking until ``wait_s`` passed.
        database = engine.url.database
        if not database or database == ":memory:" or engine.url.query.get("mode") == "memory":
            yield True
            return
        folder = f"{database}.locks"
        make_lock_folder(folder)
        path = os.path.join(folder, hashlib.sha256(name.encode()).hexdigest())
        # Tried without blocking until the deadline, in turn with the other waiters
        # (``_Turns``, as the schema lock): tries every 50 ms alone lost every release
        # to a holder that takes the lock again at once (bug PJ). Bounded by time (a
        # holder may hang), which the attempt-counted policies of ``uprof.retry`` are not.
        deadline = time.monotonic() + wait_s
        taken: list[int] = []

        def take() -> bool:
            fd = _lock_file(path)
            if fd is not None:
                taken.append(fd)
            return fd is not None

        turns = _Turns(f"{path}{NAMED_TURN_SUFFIX}", take)
        try:
            turns.take_by(deadline)
        finally:
            turns.close()
        if not taken:
            yield False
            return
        fd = taken[0]
        old_fd = None
        try:
            if previous_release_shared is not None:
                # The previous release flocked ``<database>.<name>-lock`` exclusively and
                # kept the file (bug KJ); a shared flock of it conflicts with that alone.
                # Never deleted here: a process of that release may hold or open it.
                old_fd = open_lock_file(f"{database}.{previous_release_shared}-lock")
                if not _poll_flock(old_fd, shared=True, deadline=deadline):
                    yield False
                    return
            yield True
        finally:
            if old_fd is not None:
                os.close(old_fd)
            # Per-key names would leave a file per key ever used: the holder deletes its
            # file while it still holds it, then lets go. A waiter that flocked the
            # deleted file sees that the path no longer names it and opens the path
            # again (``_lock_file``), so two processes never both hold one name.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            os.close(fd)  # releases the flock

    def fold_log(self, engine: sa.Engine, *, timeout_s: float | None = None) -> bool:
        # The pragma does not raise when it cannot finish: a reader in another process
        # (a shell, a backup tool, a scan) holding a snapshot leaves it answering busy=1,
        # the WAL left whole, deleted bytes and all (bug CA). It also answers busy while
        # another process runs a checkpoint (another uprof process folding the same
        # store). So it is tried again until FOLD_TIMEOUT_S, each try with a short busy
        # wait (FOLD_TRY_MS): TRUNCATE takes the file's write lock and, under the busy
        # handler, keeps it while it waits for the readers to go; with the connections'
        # 30 s every other process's commit to the file (the rate limit's, the
        # projector's) waited or failed "database is locked" for as long (bug CT).
        # Between tries the lock is free for them. Not no wait at all: under a steady
        # stream of commits and reads a try that cannot hold off new writers for a
        # moment rarely finds the log idle, and the fold starved (30 s, measured).
        deadline = time.monotonic() + (FOLD_TIMEOUT_S if timeout_s is None else timeout_s)
        while True:
            with engine.connect() as conn:
                driver = conn.connection.driver_connection
                assert driver is not None
                driver.execute(f"PRAGMA busy_timeout={FOLD_TRY_MS}")
                try:
                    row = driver.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                finally:
                    # The connection goes back to the pool: the usual patience again.
                    driver.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            if row is None or int(row[0]) == 0:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(FOLD_RETRY_S)

    def hold_open(self, engine: sa.Engine) -> Callable[[], None]:
        # A flock of a file of its own (never the database file: FIELD-NOTES 8.1); the
        # kernel drops it on close, the system when the process dies (kill -9 too).
        fd = _open_lock(engine, shared=True)
        if fd is None:
            return lambda: None
        return lambda: os.close(fd)

    @contextlib.contextmanager
    def stores_alone(self, engine: sa.Engine) -> Iterator[None]:
        fd = _open_lock(engine, shared=False)
        try:
            yield
        finally:
            if fd is not None:
                os.close(fd)

    def events_table_candidates(self, engine: sa.Engine) -> list[tuple[str | None, str]]:
        return [(None, EVENTS_TABLE)]

    def head_index_target(self) -> tuple[str, str]:
        # The rowid (the notification id) rides along in every SQLite index.
        return EVENTS_TABLE, "originator_id"

    def events_table(self, recorder: Any) -> tuple[str, str]:
        return recorder.events_table_name, "rowid"

    def tracking_table(self, recorder: Any) -> str:
        return "tracking"  # the library's fixed name on SQLite

    def table_columns(
        self, engine: sa.Engine, tables: Sequence[str], *, schema: str | None
    ) -> dict[str, dict[str, str]]:
        # pragma_table_info per table, on one connection: a table that is not there
        # yields no row. No ``schema``: each store is its own file ("main").
        found: dict[str, dict[str, str]] = {}
        with engine.connect() as conn:
            for table in tables:
                rows = conn.execute(
                    sa.text("SELECT name, type FROM pragma_table_info(:table)"), {"table": table}
                )
                columns = {str(name): str(declared) for name, declared in rows}
                if columns:
                    found[table] = columns
        return found

    def column_type_fits(self, column: str, declared: str) -> bool:
        return column_type_fits(column, declared)

    def stream_key(self, stream_id: UUID) -> str:
        return stream_id.hex  # eventsourcing keeps uuids as 32-hex text on SQLite

    def driver_param(self, name: str) -> str:
        return f":{name}"  # sqlite3's named style

    def end_raw_read(self, raw: Any) -> None:
        return None  # sqlite3 opens no transaction for a SELECT

    def any_of(self, column: str, ids: Sequence[str], cast: str = "") -> tuple[str, Any]:
        # One JSON list through json_each instead of an expanded IN list.
        return f"{column} IN (SELECT value FROM json_each(:ids))", json.dumps(list(ids))

    def append_only_ddl(self, tables: Sequence[str]) -> list[str]:
        return [
            f"CREATE TRIGGER IF NOT EXISTS trg_{table}_no_{op.lower()} BEFORE {op} ON {table} "
            f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
            for table in tables
            for op in ("UPDATE", "DELETE")
        ]

    def drop_append_only_ddl(self) -> list[str]:
        return []  # triggers go with their tables

    def bound_lock_waits(self, conn: sa.Connection, seconds: float) -> None:
        # WAL mode: a read never waits for a writer's lock here.
        return None

    def is_transient_lock(self, error: BaseException | None) -> bool:
        code = getattr(error, "sqlite_errorcode", None)
        # BUSY or LOCKED; an extended code keeps its primary code in the low byte.
        return isinstance(code, int) and code & 0xFF in _BUSY_CODES

    def text_position(self, column: sa.ColumnElement[str], needle: str) -> sa.ColumnElement[int]:
        position: sa.ColumnElement[int] = sa.func.instr(column, needle)
        return position

    def flushed_transaction(
        self, engine: sa.Engine
    ) -> contextlib.AbstractContextManager[sa.Connection]:
        return _synchronous_for_one_commit(engine, "FULL")

    def unflushed_transaction(
        self, engine: sa.Engine
    ) -> contextlib.AbstractContextManager[sa.Connection]:
        return _synchronous_for_one_commit(engine, "NORMAL")

    def log_location(self, engine: sa.Engine) -> str:
        database = engine.url.database or ""
        in_memory = database == ":memory:" or "mode=memory" in database
        return "sqlite:" + (
            str(Path(database).resolve()) if database and not in_memory else database
        )

    @contextlib.contextmanager
    def serialised_transaction(
        self, engine: sa.Engine, lock_key: int, *, flush: bool = True
    ) -> Iterator[sa.Connection]:
        # One writer per database file: the write lock is the lock, whatever the key.
        # ``flush`` changes nothing: the engine's own synchronous setting decides (the
        # views file: NORMAL in WAL, no fsync per commit).
        with engine.connect() as conn, conn.begin():
            dbapi = conn.connection.dbapi_connection
            if not getattr(dbapi, "in_transaction", True):
                # pysqlite begins lazily and DEFERRED; take the write lock now instead, so
                # two writers cannot both read the same state.
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            yield conn

    def upsert_from(
        self, table: sa.Table, select: sa.Select[Any], keys: Sequence[sa.Column[Any]]
    ) -> sa.Insert:
        from sqlalchemy.dialects.sqlite import insert

        return upsert_from_with(insert, table, select, keys)

    def upsert(
        self,
        table: sa.Table,
        rows: Sequence[Mapping[str, Any]],
        keys: Sequence[sa.Column[Any]],
        set_: Mapping[str, Any],
    ) -> sa.Executable:
        from sqlalchemy.dialects.sqlite import insert

        return upsert_with(insert, table, rows, keys, set_)

    def scan_tables(self, engine: sa.Engine, terms: Sequence[str]) -> TableScan:
        # The databases are files in the data folder: the file scan's child reads them
        # (raw bytes and tables, from a snapshot; FIELD-NOTES 8.1).
        return TableScan(0, [])

    def backup(self, settings: Settings, out: Path) -> dict[str, Any]:
        # Each file through the backup API: one consistent snapshot, read by the driver.
        from uprof.services import backup as b

        revision, audit = None, (0, "")
        anchors: dict[str, Any] = {}
        # The late check's positions as they stand before the audit log is copied: the
        # event log is copied after it, and a check meanwhile may pass a request whose
        # entry the copied audit log lacks (review of 0112).
        checked = _check_positions(settings.data_dir / "events.sqlite")
        for name in SQLITE_FILES:
            live = settings.data_dir / name
            if not live.exists():
                raise b.BackupError(f"{live} does not exist: nothing to back up (start uprof once)")
            target = out / name
            if name == "events.sqlite":
                # Before the copy: every version these anchors name is in it (bug JM).
                anchors = b.log_anchors_now(settings)
            src = sqlite3.connect(live, timeout=30)
            dst = sqlite3.connect(target)
            try:
                src.execute("PRAGMA busy_timeout=30000")
                src.backup(dst)  # one consistent snapshot of the file, through the driver
                dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
            finally:
                dst.close()
                src.close()
            os.chmod(target, 0o600)
            if name == "events.sqlite":
                _check_positions_back(target, checked)
                # The copy itself, not the live file after it (review of 0150, bug JM).
                copied = sa.create_engine(f"sqlite:///{target}")
                try:
                    with copied.connect() as conn:
                        b.refuse_damaged_copy(conn, anchors)
                finally:
                    copied.dispose()
            if name == "views.sqlite":
                engine = sa.create_engine(f"sqlite:///{target}")
                try:
                    with engine.connect() as conn:
                        revision, audit = b._views_revision(conn), b._audit_head(conn)
                finally:
                    engine.dispose()
        policy = settings.data_dir / POLICY_STORE_FILE
        if policy.exists():
            # The policy, for a restore into a data folder that has none (a disaster took
            # the folder); a restore beside a live policy keeps the live one.
            _sqlite_copy(policy, out / POLICY_STORE_FILE)
            os.chmod(out / POLICY_STORE_FILE, 0o600)
        return b._manifest(settings, self.name, revision, audit)

    def holds_a_policy(self, settings: Settings) -> bool:
        return _holds_a_policy(settings.data_dir / POLICY_STORE_FILE)

    def holds_a_deployment(self, settings: Settings, engine: sa.Engine | None = None) -> bool:
        # Looked for, then read without writing (a SQLite connection in its default mode
        # makes the file it names): another program's database of the same name is no
        # deployment (bug XO), a file that cannot be read is a damaged one.
        return any(
            _holds_uprof_tables(settings.data_dir / name)
            for name in DATA_STORE_FILES
            if (settings.data_dir / name).is_file()
        )

    def why_unwritable(self, settings: Settings, engine: sa.Engine | None = None) -> str | None:
        # ``os.access`` asks the kernel as an open would: an immutable file or folder,
        # and a read-only mount, refuse root too, which no mode bit does (bug XQ).
        data = settings.data_dir
        if not os.path.lexists(data):
            above = data.parent
            while not os.path.lexists(above):
                above = above.parent
            if not os.access(above, os.W_OK | os.X_OK):
                return f"the folder {above}, where it is to be made, cannot be written"
            return None
        if not data.is_dir():
            return None  # the settings' rule names a data folder that is not one
        if not os.access(data, os.W_OK | os.X_OK):
            return (
                "the folder cannot be written (SQLite makes its journal and shared memory "
                "files beside each store)"
            )
        for name in sorted(os.listdir(data)):
            path = data / name
            if name.startswith(DATA_STORE_FILES) and path.is_file():
                if not os.access(path, os.R_OK | os.W_OK):
                    return f"its file {name} cannot be written"
        return None

    def another_programs_store(self, settings: Settings) -> str | None:
        # Only where the folder holds no deployment at all: a store of uprof's beside
        # (its tables renamed by hand, say) is the deployment's, damaged or not, and its
        # start names what is wrong.
        if self.holds_a_deployment(settings):
            return None
        for name in DATA_STORE_FILES:
            path = settings.data_dir / name
            tables = _table_names(path) if path.is_file() else None
            if tables:
                listed = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
                return f"{name} is another program's database (its tables: {listed})"
        return None

    def database_missing(self, settings: Settings, error: BaseException) -> bool:
        return False  # a data folder, not a server: its absence is holds_a_deployment's

    def restore(self, settings: Settings, src: Path, keep_live_audit: bool) -> None:
        from uprof.services.backup import AUDIT_KEYS

        data = settings.data_dir
        for leftover in data.glob(".restore-views-*"):  # from a restore that was killed
            leftover.unlink(missing_ok=True)
        # Views first (the position must not run ahead of the log), prepared in full in a
        # private file, then copied over the live file in one SQLite transaction.
        staged = data / f".restore-views-{secrets.token_hex(4)}.sqlite"
        try:
            _sqlite_copy(src / "views.sqlite", staged)
            if keep_live_audit:
                conn = sqlite3.connect(staged)
                try:
                    conn.execute("ATTACH DATABASE ? AS live", (str(data / "views.sqlite"),))
                    # The audit tables only grow: append the live rows the backup lacks.
                    with conn:
                        for table, key in AUDIT_KEYS.items():
                            match = " AND ".join(f"m.{c} = l.{c}" for c in key)
                            conn.execute(
                                f"INSERT INTO main.{table} SELECT * FROM live.{table} AS l "
                                f"WHERE NOT EXISTS (SELECT 1 FROM main.{table} AS m WHERE {match}) "
                                f"ORDER BY {', '.join(f'l.{c}' for c in key)}"
                            )
                    conn.execute("DETACH DATABASE live")
                finally:
                    conn.close()
            _sqlite_copy(staged, data / "views.sqlite")
        finally:
            for suffix in ("", "-journal", "-wal", "-shm"):
                staged.with_name(staged.name + suffix).unlink(missing_ok=True)
        _sqlite_copy(src / "events.sqlite", data / "events.sqlite")
        # The live policy stays (a backup taken before a right was revoked must not grant
        # it again: the live log records the revocation); a data folder without one takes
        # the backup's, if the backup lists it (backups before 2026-12-05 hold none).
        policy = src / POLICY_STORE_FILE
        if _listed(src, POLICY_STORE_FILE) and not _holds_a_policy(data / POLICY_STORE_FILE):
            _sqlite_copy(policy, data / POLICY_STORE_FILE)


@contextlib.contextmanager
def _synchronous_for_one_commit(engine: sa.Engine, level: str) -> Iterator[sa.Connection]:
    """A transaction committed at ``PRAGMA synchronous=<level>``. The setting is the
    connection's, set outside a transaction: ``level`` for this one commit, then the
    engine's own setting again before the connection goes back to the pool (invalidated
    if that fails: never pooled with another setting)."""
    with engine.connect() as conn:
        own = conn.exec_driver_sql("PRAGMA synchronous").scalar_one()
        conn.exec_driver_sql(f"PRAGMA synchronous={level}")
        conn.commit()  # SQLAlchemy began one for the PRAGMAs; nothing to commit
        try:
            with conn.begin():
                yield conn
        finally:
            try:
                conn.exec_driver_sql(f"PRAGMA synchronous={int(own)}")
                conn.commit()
            except BaseException:
                conn.invalidate()
                raise


def _listed(src: Path, name: str) -> bool:
    """Whether the backup's manifest lists ``name`` with the file's checksum (checked again
    here, as ``read_manifest`` checked every listed file: nothing unlisted is restored)."""
    from uprof.services.backup import MANIFEST, _sha256

    path = src / name
    if not path.is_file():
        return False
    files = json.loads((src / MANIFEST).read_text(encoding="utf-8")).get("files", {})
    meta = files.get(name) if isinstance(files, dict) else None
    return isinstance(meta, dict) and meta.get("sha256") == _sha256(path)


def _holds_a_policy(database: Path) -> bool:
    """Whether the policy store's database holds a policy (any recorded change)."""
    if not database.exists():
        return False
    conn = sqlite3.connect(database, timeout=30)
    try:
        conn.execute("PRAGMA busy_timeout=30000")
        found = conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?", (EVENTS_TABLE,)
        ).fetchone()
        return found is not None and (
            conn.execute(f"SELECT EXISTS (SELECT 1 FROM {EVENTS_TABLE})").fetchone()[0] == 1
        )
    finally:
        conn.close()


def _open_lock(engine: sa.Engine, *, shared: bool) -> int | None:
    """A non-blocking flock of the views database's open-lock file (None: in memory)."""
    import fcntl

    database = engine.url.database
    if not database or database == ":memory:" or engine.url.query.get("mode") == "memory":
        return None
    fd = open_lock_file(f"{database}{OPEN_LOCK_SUFFIX}")
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        if shared:
            raise StoresInUseError(
                f"a restore holds the stores of {Path(database).parent}; start again once "
                "it has finished"
            ) from None
        raise StoresInUseError(
            f"another uprof process has the stores of {Path(database).parent} open; stop "
            "every uprof process on this deployment (servers, workers, MCP) before a restore"
        ) from None
    return fd


def _sqlite_copy(source: Path, target: Path) -> None:
    """Copy one SQLite database over another through the backup API (one transaction)."""
    src = sqlite3.connect(source, timeout=30)
    dst = sqlite3.connect(target, timeout=30)
    try:
        dst.execute("PRAGMA busy_timeout=30000")
        src.backup(dst)
    finally:
        dst.close()
        src.close()


#: Typed as the protocol, so the type checker holds the class to all of it.
SQLITE: Backend = SQLiteBackend()


def _check_positions(events: Path) -> dict[str, int]:
    """The late check's positions (decision 0112-late-check-durable) in a live event log,
    read through the driver."""
    from uprof.services.late_captures import CHECK_ROW_PREFIX

    if not events.exists():
        return {}
    conn = sqlite3.connect(events, timeout=30)
    try:
        conn.execute("PRAGMA busy_timeout=30000")
        rows = conn.execute(
            "SELECT application_name, notification_id FROM tracking "
            "WHERE substr(application_name, 1, ?) = ?",
            (len(CHECK_ROW_PREFIX), CHECK_ROW_PREFIX),
        ).fetchall()
    except sqlite3.OperationalError:  # no tracking table yet: nothing checked
        return {}
    finally:
        conn.close()
    return {str(name): int(at) for name, at in rows}


def _check_positions_back(copy: Path, checked: dict[str, int]) -> None:
    """In a backup's event log, move each check position back to where it stood before
    the backup's audit log was copied: a request checked since (its entry on the live
    log, not on the copied one) is checked again after a restore, not passed for ever.
    A position started since stays (nothing before it was checked by anyone)."""
    if not checked:
        return
    conn = sqlite3.connect(copy)
    try:
        with conn:
            conn.executemany(
                "UPDATE tracking SET notification_id = ? "
                "WHERE application_name = ? AND notification_id > ?",
                [(at, name, at) for name, at in checked.items()],
            )
    finally:
        conn.close()


def _write_holder_record(fd: int, purpose: str) -> None:
    """Write who holds the flock of ``fd`` (a schema lock, or a turnstile) into its
    file, for the processes waiting (``_schema_lock_holder_of``)."""
    record = schema_lock_holder(purpose)
    record["started"] = _process_started(os.getpid())
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)


def _lock_file(path: str) -> int | None:
    """The descriptor of ``path`` flocked exclusively, or None while a live process holds it.

    Holders delete their file before they let go (``SqliteBackend.named_lock``), so the
    file flocked may no longer be the one at ``path``: its lock then guards nothing, and
    the path is opened again (a new file, or another process's). A file left by a holder
    that died is flocked, used and deleted by the next holder of its name."""
    while True:
        fd = open_lock_file(path)
        if not _flocked(fd, shared=False):
            os.close(fd)
            return None  # a live holder: the caller polls, as PostgreSQL's try-lock is
        try:
            at_path = os.stat(path)
        except FileNotFoundError:
            at_path = None
        mine = os.fstat(fd)
        if at_path is not None and (at_path.st_dev, at_path.st_ino) == (mine.st_dev, mine.st_ino):
            return fd
        os.close(fd)  # deleted by its last holder after we opened it: open the path again


def _flocked(fd: int, *, shared: bool) -> bool:
    """Whether ``fd`` now holds an flock (shared or exclusive) without waiting; False
    while another holder's lock conflicts."""
    import fcntl

    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _poll_flock(fd: int, *, shared: bool, deadline: float) -> bool:
    """Try ``_flocked`` every ``NAMED_LOCK_POLL_S`` until it holds or ``deadline``
    (monotonic) has passed; polling a lock until a deadline, not retrying a failure."""
    while True:
        held = _flocked(fd, shared=shared)
        if held or time.monotonic() >= deadline:
            return held
        time.sleep(NAMED_LOCK_POLL_S)


class _Turns:
    """Takes a lock through ``try_lock`` (one try without blocking; True once held) in
    turn with the other processes waiting for it, through a turnstile file (``turn``).

    Waiting by tries every ``NAMED_LOCK_POLL_S`` (0180) lost every release to a holder
    that takes the lock again at once (a rebuild after a rebuild): a waiter's try had to
    fall in the moment between, and ten ``uprof backup`` starts beside a looping rebuild
    took 156 s where blocking waits took 28 s (bug OU, decision 0191); the named locks
    the same (bug PJ). So a process that has to wait holds the turnstile's exclusive
    flock while it tries the lock, and every process looks at the turnstile before its
    first try: while someone waits there, it waits behind them (for the turnstile)
    instead of taking the lock the moment it is released. A waiter behind the turnstile
    for ``TURN_PATIENCE_S`` also tries the lock itself: a live holder of the turnstile
    has the lock by then, a stopped one must not keep the others from it (bug PK).
    Still only tries without blocking, so a stopped lock holder is reported and a stop
    is seen. The turnstile file exists only while a process waits: its holder deletes
    it before it lets go (as ``named_lock``'s files, ``_lock_file``), so the named
    locks' turnstiles, one per name, leave no file per name ever used. It tells who
    waits next (``waiting_ahead``); the lock alone decides who holds it."""

    def __init__(self, turn: str, try_lock: Callable[[], bool]) -> None:
        self._path, self._try_lock = turn, try_lock
        self._turn: int | None = None  # the turnstile's descriptor while held here
        self._behind_since: float | None = None

    def take_by(self, deadline: float, stopping: Callable[[], bool] = lambda: False) -> bool:
        """Whether this process holds the lock by ``deadline`` (monotonic), unless
        ``stopping()`` says first that it was asked to stop (looked at between tries);
        called again after False, it goes on waiting where it was (the turnstile kept)."""
        if self._behind_since is None:
            if not self._someone_waits() and self._try_lock():
                return True
            self._behind_since = time.monotonic()
        while True:
            if self._turn is None:
                self._turn = _lock_file(self._path)
                if self._turn is not None:
                    _write_holder_record(self._turn, "")  # who waits next
            patience_over = time.monotonic() - self._behind_since >= TURN_PATIENCE_S
            if (self._turn is not None or patience_over) and self._try_lock():
                self.close()  # the next waiter's turn
                return True
            if time.monotonic() >= deadline or stopping():
                return False
            time.sleep(NAMED_LOCK_POLL_S)

    def _someone_waits(self) -> bool:
        try:
            fd = open_lock_file(self._path, create=False)
        except FileNotFoundError:
            return False  # nobody waits: no turnstile
        try:
            return not _flocked(fd, shared=True)
        finally:
            os.close(fd)  # and its shared flock with it

    def waiting_ahead(self) -> str:
        """For a waiter's report: the live process that holds the turnstile, if another
        does ("; pid N ... waits its turn ahead of this process ..."), else ""."""
        if self._turn is not None:
            return ""
        try:
            fd = open_lock_file(self._path, create=False)
        except (OSError, LockFileAccessError):
            return ""
        try:
            ahead = _schema_lock_holder_of(fd)
        finally:
            os.close(fd)
        if not ahead.startswith("pid "):  # let go, killed, or not written yet
            return ""
        return (
            f"; {ahead} waits its turn ahead of this process (it holds {self._path}; "
            f"passed by after {TURN_PATIENCE_S:g} s if it is stopped)"
        )

    def close(self) -> None:
        """Leave the turnstile (a no-op when not held here): its file deleted while
        still held, then the flock let go, as ``named_lock``'s holders do."""
        if self._turn is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)
        os.close(self._turn)
        self._turn = None


#: The most of a schema lock file read for its holder's record (one short JSON object).
_HOLDER_RECORD_MAX = 4096


def _schema_lock_holder_of(fd: int) -> str:
    """The holder of the schema lock file ``fd``, as its record names it, for a waiter.

    The file may hold anything: nothing (a holder of an earlier release, which wrote
    none, or one that has just taken the lock), a record left by a holder that died
    (kill -9 skips the truncation at release), or bytes that are not ours. A record
    whose process no longer runs on this host is not named as the holder."""
    try:
        raw = os.pread(fd, _HOLDER_RECORD_MAX, 0)
        record = json.loads(raw.decode())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        record = None
    described = described_holder(record)
    if not described.startswith("pid ") or record.get("host") != socket.gethostname():
        return described
    pid = record["pid"]
    try:
        os.kill(pid, 0)  # signal 0: whether the process exists; described_holder: pid > 0
    except ProcessLookupError:
        alive = False
    except PermissionError:
        alive = True  # another user's process
    else:
        alive = True
    started = record.get("started")
    running = _process_started(pid) if alive else None
    if running is not None and (
        not isinstance(started, int) or isinstance(started, bool) or started != running
    ):
        # The pid was reused since, or the record does not say when its process started
        # (this release always does: a hand-written or foreign record, bug NN): naming
        # it would point the operator, who is told to end the holder, at another process.
        alive = False
    if alive:
        return described
    return (
        f"a process that did not say who it is (the lock file names pid {pid}, which no "
        "longer runs, or not as the process that wrote it: a holder killed before it let "
        "go left it)"
    )


def _process_started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, /proc/<pid>/stat field
    22), telling a process from a later one given the same pid; None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None
