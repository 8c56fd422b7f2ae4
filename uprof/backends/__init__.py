"""Storage backends: everything uprof does differently on SQLite and on PostgreSQL.

Callers ask a ``Backend`` object (``backend_for_url``, ``backend_for``,
``backend_for_settings``), never the dialect name. Adding a backend means three
places: its module here (a class satisfying ``Backend``), its entry in ``REGISTRY``,
and its parametrisation of the ``backend`` fixture in tests/conftest.py
(docs/architecture.md, "How to add a storage backend").

The registry names modules, imported on first use: a SQLite deployment never imports
psycopg, and ``import uprof.backends`` costs nothing at CLI start.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

from audit.lockfile import LockFileAccessError as LockFileAccessError
from audit.lockfile import LockFileRefusedError as LockFileRefusedError
from audit.lockfile import lock_file_error as lock_file_error
from domain.errors import UprofError

if TYPE_CHECKING:
    import sqlalchemy as sa

    from uprof.settings import Settings

#: SQLAlchemy backend name (the URL scheme before any ``+driver``) -> ``module:attribute``.
REGISTRY: dict[str, str] = {
    "sqlite": "uprof.backends.sqlite:SQLITE",
    "postgresql": "uprof.backends.postgres:POSTGRES",
}
#: The backend of a deployment with no database URL (the embedded default).
EMBEDDED = "sqlite"


class StoresInUseError(UprofError):
    """Another uprof process has the stores open (or a restore holds them alone)."""

    hint = "stop every uprof process on this deployment (servers, workers, MCP), then retry"


class SchemaLockWaitError(UprofError):
    """A start (or a rebuild) waited for a store's schema lock longer than
    ``schema_lock_wait_s``, and stopped without changing anything."""

    hint = (
        "another uprof process holds the lock (an upgrade or a rebuild); let it finish, "
        "end it if it is stopped or stuck, or raise UPROF_SCHEMA_LOCK_WAIT_S (0: no limit)"
    )


#: A start waiting for the schema lock says so after this long (seconds), then again
#: every ``SCHEMA_LOCK_REPORT_EVERY_S``: a start waits this long behind another start
#: that upgrades a store, or creates a new one, without a word.
SCHEMA_LOCK_FIRST_REPORT_S = 2.0
SCHEMA_LOCK_REPORT_EVERY_S = 30.0
#: A wait looks at least this often (seconds) whether the process was asked to stop
#: (``stop_schema_lock_waits``, or a signal ``_stops_on_default_signals`` caught).
SCHEMA_LOCK_STOP_CHECK_S = 0.25


class SchemaLockWaitStopped(SchemaLockWaitError):
    """The process was asked to stop (``stop_schema_lock_waits``: a worker's SIGTERM;
    or SIGTERM or SIGINT left to their defaults, ``signal_number``) while it waited for
    a schema lock; it changed nothing."""

    hint = "nothing to do: the process stopped as asked, before it started"

    def __init__(self, message: str, *, signal_number: int | None = None) -> None:
        super().__init__(message)
        self.signal_number = signal_number


#: The connections this thread's schema locks are held on, with their engines and the
#: holding thread (``lock_connection``): set by a backend whose lock is a database
#: session's. The thread is kept too: a context copied into another thread (asyncio's
#: ``to_thread``, anyio's worker threads) must not share a connection with its holder.
_held_on: ContextVar[tuple[tuple[sa.Engine, sa.Connection, int], ...]] = ContextVar(
    "uprof_schema_lock_connections", default=()
)


@contextlib.contextmanager
def lending_lock_connection(engine: sa.Engine, conn: sa.Connection) -> Iterator[None]:
    """For the block: ``conn`` (a connection of ``engine`` holding a schema lock for this
    thread) is what ``lock_connection(engine)`` answers in this thread."""
    token = _held_on.set((*_held_on.get(), (engine, conn, threading.get_ident())))
    try:
        yield
    finally:
        _held_on.reset(token)


def lock_connection(engine: sa.Engine) -> sa.Connection | None:
    """The connection of ``engine`` a schema lock of this thread is held on, or None (no
    lock held here, or a lock that is not a session's: SQLite's file lock).

    A start's reads under the lock (the revisions a store is at, the tables' shapes, the
    policy store's anchors) go through it: it is idle while its holder works, and a
    pooled connection taken beside it cost the server one more session per start
    (0253-postgres-case-cost). The caller ends the transaction its reads began
    (``reading_connection`` does): the lock is the session's, and stays."""
    here = threading.get_ident()
    for held_engine, conn, thread in reversed(_held_on.get()):
        if held_engine is engine and thread == here:
            return conn
    return None


@contextlib.contextmanager
def reading_connection(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A connection of ``engine`` for a few reads: the one this thread's schema lock is
    held on (``lock_connection``), its read transaction ended after the block, or else
    one from the pool, given back after it."""
    held = lock_connection(engine)
    if held is None:
        with engine.connect() as conn:
            yield conn
        return
    try:
        yield held
    finally:
        held.rollback()


#: Set by ``stop_schema_lock_waits`` (from a signal handler): every wait of this process
#: that has not got its lock ends at its next look (bug NM).
_stop_asked = False


def stop_schema_lock_waits() -> None:
    """End this process's waits for a schema lock (``SchemaLockWaitStopped``), from a
    signal handler: it only assigns a flag (no lock, no I/O). A process that handles
    SIGTERM itself (``uprof worker``: it finishes its batch first) would otherwise wait
    through its whole bound (none with 0) before it could stop, and then start: the
    supervisor's grace period ran out and it was killed. A lock already taken is kept:
    the upgrade under it finishes, as any batch in hand does."""
    global _stop_asked
    _stop_asked = True


_log = logging.getLogger("uprof.backends")


def schema_lock_holder(purpose: str) -> dict[str, Any]:
    """What a holder of a schema lock tells the processes waiting for it: its pid, host,
    when it took the lock, and what for (a fixed phrase of uprof's, never user input)."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.time(),
        "purpose": purpose,
    }


def wait_for_schema_lock(
    try_until: Callable[[float, Callable[[], bool]], bool],
    holder: Callable[[], str],
    *,
    store: str,
    wait_s: float,
) -> None:
    """Take a store's schema lock through ``try_until`` (waits until the monotonic
    deadline it is given, or until the predicate it is given says the process was asked
    to stop; True once held), reporting the wait.

    The lock's holder may be stopped (SIGSTOP, a debugger, a frozen container), not
    dead: the lock stays held and a blocking wait never ends, with nothing said. Here
    a wait longer than ``SCHEMA_LOCK_FIRST_REPORT_S`` logs one warning naming the store
    and ``holder()``, again every ``SCHEMA_LOCK_REPORT_EVERY_S``; after ``wait_s``
    (0: no limit) it raises ``SchemaLockWaitError``. Never does it go on without the
    lock: two upgrades of one store at once are worse than a failed start.

    A process that left SIGTERM and SIGINT to Python's defaults (every CLI command,
    ``uprof serve`` and ``uprof mcp`` before their servers handle them) and gets one
    while it waits ends the wait with ``SchemaLockWaitStopped`` naming the signal
    (bug OA); ``uprof worker`` handles them itself (``stop_schema_lock_waits``).
    """
    started = time.monotonic()
    # The handlers first, then one wait from the start: a first try without waiting,
    # then the wait, left a moment between them in which a holder taking the lock again
    # at once took it, as long as a loaded machine kept this process from queueing
    # (bug SU; the try saved four ``signal.signal`` calls of an uncontended take).
    with _stops_on_default_signals() as caught:
        took = _wait_reporting(try_until, holder, caught, started, store, wait_s)
    if took and caught:
        # Taken at the moment the signal came: the process does as the signal's default
        # says (dies, or raises KeyboardInterrupt), as it would have without the wait.
        signal.raise_signal(caught[0])


def _wait_reporting(
    try_until: Callable[[float, Callable[[], bool]], bool],
    holder: Callable[[], str],
    caught: list[int],
    started: float,
    store: str,
    wait_s: float,
) -> bool:
    give_up = None if wait_s == 0 else started + wait_s
    report_at = started + SCHEMA_LOCK_FIRST_REPORT_S
    reported = False

    def stopping() -> bool:
        return _stop_asked or bool(caught)

    while True:
        until = report_at if give_up is None else min(report_at, give_up)
        # One wait until the next report (or the bound), ended early by a stop asked for
        # (each backend looks at ``stopping`` every ``SCHEMA_LOCK_STOP_CHECK_S`` at most,
        # and never after an uncontended take). Never in short turns that leave the
        # queue: PostgreSQL's waiter left it every 0.25 s to look, and a holder taking
        # the lock again at once took it in each moment the waiter was out, as often as
        # a loaded machine kept the waiter's process from queueing again (bug SU).
        if try_until(until, stopping):
            if reported:
                _log.warning(
                    "took the schema lock of %s after %.0f s", store, time.monotonic() - started
                )
            return True
        now = time.monotonic()
        if _stop_asked or caught:
            by = f" by {signal.Signals(caught[0]).name}" if caught else ""
            raise SchemaLockWaitStopped(
                f"asked to stop{by} while waiting {now - started:.0f} s for the schema lock "
                f"of {store}, held by {holder()}; nothing was changed",
                signal_number=caught[0] if caught else None,
            )
        if give_up is not None and now >= give_up:
            raise SchemaLockWaitError(
                f"gave up after waiting {wait_s:g} s (UPROF_SCHEMA_LOCK_WAIT_S) for the "
                f"schema lock of {store}, held by {holder()}; nothing was changed"
            )
        if now < report_at:
            continue
        limit = "no limit" if give_up is None else f"gives up after {wait_s:g} s"
        _log.warning(
            "waiting %.0f s for the schema lock of %s, held by %s (%s, UPROF_SCHEMA_LOCK_WAIT_S)",
            now - started,
            store,
            holder(),
            limit,
        )
        reported = True
        report_at = now + SCHEMA_LOCK_REPORT_EVERY_S


#: What a wait for a schema lock ends on (``_stops_on_default_signals``).
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def _stops_on_default_signals() -> Iterator[list[int]]:
    """While a wait lasts, catch SIGTERM and SIGINT where the process left them to
    Python's defaults, into the list yielded (the wait looks at it after each try).

    With the defaults, SIGTERM killed a waiting CLI command, ``uprof serve`` or
    ``uprof mcp`` without a word (a supervisor's log said nothing of why it never
    started), and SIGINT raised ``KeyboardInterrupt`` wherever the wait was, printed
    as "Aborted!" or a traceback (bug OA). A handler the process installed itself
    (``uprof worker``'s, an embedding program's) or an ignored signal is left alone;
    so is every signal outside the main thread, where Python cannot set handlers."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        caught.append(signum)  # no lock, no I/O: a signal handler

    replaced: dict[int, Any] = {}
    for signum in _STOP_SIGNALS:
        current = signal.getsignal(signum)
        if current is signal.SIG_DFL or current is signal.default_int_handler:
            replaced[signum] = current
            signal.signal(signum, on_signal)
    try:
        yield caught
    finally:
        for replaced_signal, previous in replaced.items():
            signal.signal(replaced_signal, previous)


def described_holder(record: Any, *, backend_pid: int | None = None) -> str:
    """A schema lock holder as the waiting message names it, from what the holder
    wrote (``schema_lock_holder``), read back from a file or a session name: any
    value at all, a record of another release or garbage included."""
    session = "" if backend_pid is None else f" in PostgreSQL session {backend_pid}"
    if not isinstance(record, dict):
        return "a process that did not say who it is" + session
    pid, host = record.get("pid"), record.get("host")
    since, purpose = record.get("since"), record.get("purpose")
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 2**31:
        return "a process that did not say who it is" + session
    words = [f"pid {pid}"]
    if isinstance(host, str) and host and host.isprintable():
        words.append(f"on {host[:64]}")
    if isinstance(purpose, str) and purpose and purpose.isprintable():
        words.append(f"({purpose[:80]})")
    if isinstance(since, int | float) and not isinstance(since, bool) and 0 < since < 2**40:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
        words.append(f"since {stamp}")
    return " ".join(words) + session


@dataclass(frozen=True)
class StorageLayout:
    """Where each store lives for one deployment."""

    views_url: str
    keys_url: str
    events_url: str  # the same store eventsourcing writes, for snapshot purges and scans
    eventsourcing_env: dict[str, str]
    events_path: Path | None  # the event log's file, when it is one (residue scans)


@dataclass(frozen=True)
class TermHit:
    """A residue-scan term found in a table's column (``row``: the backend's row address)."""

    table: str
    column: str
    row: str
    term: str


@dataclass(frozen=True)
class TableScan:
    """What a backend's in-place table scan read and found; ``unreadable``: (relation,
    why) for each one listed that it could not read (the report cannot be clean)."""

    tables: int
    hits: list[TermHit]
    unreadable: list[tuple[str, str]] = field(default_factory=list)


class Backend(Protocol):
    """One storage backend's specifics (an implementation per module of this package)."""

    #: Short name, as written in backup manifests ("sqlite", "postgres").
    name: str
    #: The files a backup of this backend holds besides its manifest (each one checked).
    backup_files: tuple[str, ...]
    #: eventsourcing's ``PERSISTENCE_MODULE`` for this backend.
    persistence_module: str
    #: ``module:Class`` of the process recorder with compare-and-set tracking
    #: (``uprof.recorders``): a topic, imported by eventsourcing only when a log opens.
    guarded_recorder_topic: str
    #: ``module:Class`` of the snapshot table's recorder, whose row reads tell a table of
    #: the wrong shape (``uprof.recorders``; eventsourcing has no setting for it).
    snapshot_recorder_topic: str
    #: The library's application recorder with ``snapshot_recorder_topic``'s checks:
    #: the policy store's (``policy_store_env`` names it, and that snapshot recorder).
    checked_application_recorder_topic: str
    #: Whether eventsourcing inserts rows into its tables naming no column (``INSERT INTO t
    #: VALUES (?,?,?,?)``): a column added by hand then fails every write, so the event
    #: store's start check refuses a column more as well as one less.
    writes_rows_by_position: bool
    #: Whether alembic must alter tables by copying them (``render_as_batch``).
    alters_in_batches: bool
    #: The store files this backend keeps in the key folder (SQLite's key store,
    #: ``keys.sqlite``; none on PostgreSQL): the key folder's look at a start
    #: (``uprof.storage.refuse_unwritable_stores``, bug XY) asks them to be writable.
    key_folder_stores: tuple[str, ...]

    # --- engines, URLs and eventsourcing settings --------------------------------------

    def check_database_url(self, url: str) -> str:
        """The URL as uprof's engines use it (the driver uprof ships named); raise
        ValueError (naming ``database_url``) for a URL this backend refuses."""
        ...

    def layout(self, settings: Settings) -> StorageLayout:
        """Where the views, keys and events live, and eventsourcing's settings for the log."""
        ...

    def policy_store_env(self, settings: Settings) -> dict[str, str]:
        """eventsourcing's settings for the policy store (``PolicyApplication``)."""
        ...

    def create_engine(self, url: str, *, fsync_each_commit: bool) -> sa.Engine:
        """An engine with the connection settings uprof relies on for this backend."""
        ...

    def schema_lock(
        self, engine: sa.Engine, *, wait_s: float, purpose: str
    ) -> AbstractContextManager[None]:
        """Held while a starting process creates or migrates tables (one at a time),
        and by a rebuild. Waits at most ``wait_s`` (0: no limit) through
        ``wait_for_schema_lock``, which reports the wait and raises
        ``SchemaLockWaitError``; the holder says who it is (``schema_lock_holder``,
        ``purpose``) where waiters can read it."""
        ...

    def migration_transaction(self, engine: sa.Engine) -> AbstractContextManager[sa.Connection]:
        """A connection in one transaction that a migration runs whole in: committed at
        the end of the block, rolled back on an error or with its process (kill -9), so
        a store is never left with part of a revision's changes (bug JA)."""
        ...

    def named_lock(
        self,
        engine: sa.Engine,
        name: str,
        *,
        wait_s: float,
        previous_release_shared: str | None = None,
    ) -> AbstractContextManager[bool]:
        """An exclusive lock of the deployment's, by ``name``, held until the block ends
        or its holder dies (kill -9 included), across processes and, on PostgreSQL,
        hosts. It orders work that spans more than one store's transaction (a key
        store commit, then an audit entry), which no transaction can hold. Waits at most
        ``wait_s`` (a live holder may hang); yields whether it holds the lock.

        ``previous_release_shared``: also hold, *shared*, the lock of that name as the
        previous release (decision 0158) took it, within the same wait; a process of
        that release holding it (exclusively) and this holder exclude each other, while
        holders of this release never wait for each other on it (bug KJ)."""
        ...

    def fold_log(self, engine: sa.Engine, *, timeout_s: float | None = None) -> bool:
        """Fold a write-ahead log into the main file, so deleted bytes do not linger;
        False when it could not (another process's read transaction holds it) within
        ``timeout_s`` (the backend's own bound if None; 0 is one try)."""
        ...

    def events_table_candidates(self, engine: sa.Engine) -> list[tuple[str | None, str]]:
        """(schema, table) pairs where the profiles log's events may be."""
        ...

    # --- the event store ------------------------------------------------------------------

    def head_index_target(self) -> tuple[str, str]:
        """(events table as the migration connection sees it, column list) of the
        ``events`` branch's partial head indexes (migrations/versions/0001_events_*)."""
        ...

    def events_table(self, recorder: Any) -> tuple[str, str]:
        """(qualified events table, notification id column) of an eventsourcing recorder."""
        ...

    def tracking_table(self, recorder: Any) -> str:
        """The qualified table of process positions of an eventsourcing recorder."""
        ...

    def table_columns(
        self, engine: sa.Engine, tables: Sequence[str], *, schema: str | None
    ) -> dict[str, dict[str, str]]:
        """The columns of each of ``tables`` (unqualified names, in ``schema`` where the
        backend has schemas) and their declared types, on one connection; a table that is
        not there is left out. For the stores' shape checks at start
        (``uprof.backends.damage``)."""
        ...

    def column_type_fits(self, column: str, declared: str) -> bool:
        """Whether eventsourcing's ``column`` (of an event, snapshot or tracking table),
        declared ``declared`` (as ``table_columns`` gives it), gives the library back the
        value it wrote: an integer version as an integer, the state as bytes."""
        ...

    def stream_key(self, stream_id: UUID) -> str:
        """A stream id as eventsourcing stores it in ``originator_id``."""
        ...

    def driver_param(self, name: str) -> str:
        """A named parameter in the driver's own style (for raw DB-API statements)."""
        ...

    def end_raw_read(self, raw: Any) -> None:
        """End the read transaction a raw DB-API connection may have opened."""
        ...

    def any_of(self, column: str, ids: Sequence[str], cast: str = "") -> tuple[str, Any]:
        """A condition "column is one of ids" on one bound parameter ``:ids``, and its value."""
        ...

    # --- the audit log (audit.tables.AuditBackend: audit names no database) -------------

    def append_only_ddl(self, tables: Sequence[str]) -> list[str]:
        """Triggers refusing UPDATE and DELETE (and TRUNCATE where there is one) on
        ``tables``; idempotent, free of ``%`` and ``:name`` (run by ``op.execute``)."""
        ...

    def drop_append_only_ddl(self) -> list[str]:
        """What ``append_only_ddl`` left behind once its tables are dropped."""
        ...

    def flushed_transaction(self, engine: sa.Engine) -> AbstractContextManager[sa.Connection]:
        """A write transaction whose commit reaches the disk before it returns, whatever
        the engine's own setting (an engine that does not flush each commit: the views
        and the event store's SQLite files), for a write that something flushed later
        counts on (the plain-row upgrade's record in the key folder)."""
        ...

    def unflushed_transaction(self, engine: sa.Engine) -> AbstractContextManager[sa.Connection]:
        """A write transaction whose commit is not flushed to disk before it returns,
        whatever the engine's own setting: for a write whose loss in a power cut is safe
        and that should not pay an fsync (a stream's anchor, which may only lag)."""
        ...

    def log_location(self, engine: sa.Engine) -> str:
        """Where the store behind ``engine`` lives, as far as its data can tell: a SQLite
        file's resolved path (a copy elsewhere is another place), a PostgreSQL database's
        one name for all (its key tables travel with it)."""
        ...

    def serialised_transaction(
        self, engine: sa.Engine, lock_key: int, *, flush: bool = True
    ) -> AbstractContextManager[sa.Connection]:
        """A write transaction entered one at a time per ``lock_key``; reads after
        entering see every earlier writer's commit. ``flush=False``: its commit need not
        wait for the log to reach the disk, for data whose last moments a crash of the
        database server may lose (rate-limit counters), never anything acknowledged."""
        ...

    def upsert(
        self,
        table: sa.Table,
        rows: Sequence[Mapping[str, Any]],
        keys: Sequence[sa.Column[Any]],
        set_: Mapping[str, Any],
    ) -> sa.Executable:
        """``INSERT rows ... ON CONFLICT (keys) DO UPDATE SET set_`` in one statement."""
        ...

    def upsert_from(
        self, table: sa.Table, select: sa.Select[Any], keys: Sequence[sa.Column[Any]]
    ) -> sa.Insert:
        """``INSERT INTO table SELECT ... ON CONFLICT (keys) DO UPDATE`` every other
        column the select names (by label) to the proposed row's value, in one statement:
        nothing is written when the select finds no row."""
        ...

    def bound_lock_waits(self, conn: sa.Connection, seconds: float) -> None:
        """Bound how long this transaction of ``conn`` waits for another session's lock
        (then the driver raises); over when the transaction ends. A no-op where reads
        never wait for a lock (SQLite in WAL mode)."""
        ...

    def is_transient_lock(self, error: BaseException | None) -> bool:
        """Whether a driver error (``sa.exc.OperationalError.orig``) says another writer
        holds a lock for now; by the driver's error code, never its wording."""
        ...

    def text_position(self, column: sa.ColumnElement[str], needle: str) -> sa.ColumnElement[int]:
        """Where ``needle`` starts in ``column``'s text, 1-based, 0 when absent: an exact,
        case-sensitive substring test without wildcards (which LIKE is not on SQLite)."""
        ...

    # --- operator tools ----------------------------------------------------------------

    def scan_tables(self, engine: sa.Engine, terms: Sequence[str]) -> TableScan:
        """Look for each term in every column of every table the server holds, spelled
        in any way ``residue_files.needles`` lists (case, normal form, encodings); a
        backend whose databases are files in the data folder scans nothing here (the
        residue file scan reads them, uprof.services.residue_files)."""
        ...

    def backup(self, settings: Settings, out: Path) -> dict[str, Any]:
        """Write a consistent copy of the data stores (never the key store) into the new
        folder ``out``; return the manifest (``uprof.services.backup._manifest``)."""
        ...

    def restore(self, settings: Settings, src: Path, keep_live_audit: bool) -> None:
        """Replace the data stores with the backup in ``src`` (views before the log);
        ``keep_live_audit``: keep the live audit rows, which extend the backup's. The
        live policy store is kept when it holds a policy (``holds_a_policy``)."""
        ...

    def holds_a_policy(self, settings: Settings) -> bool:
        """Whether the live policy store holds a policy (any recorded change): the one a
        ``restore`` keeps instead of the backup's."""
        ...

    def holds_a_deployment(self, settings: Settings, engine: sa.Engine | None = None) -> bool:
        """Whether the data stores ``settings`` names hold a deployment, found without
        making anything (no folder, no file, no table): any store of one, whole or not
        (a damaged one is the start's to refuse, naming what is wrong). Asked before a
        command that reads a deployment opens its stores
        (``uprof.storage.refuse_without_deployment``). ``engine``: a server backend's
        engine for that database to ask through (the start's, ``storage.start_engine``),
        left open; without one, an engine of its own, disposed after."""
        ...

    def another_programs_store(self, settings: Settings) -> str | None:
        """Which store of ``settings`` is another program's, where the data stores hold
        no deployment but a store file holds tables none of which is uprof's (SQLite;
        bug XU), or None. Read without writing."""
        ...

    def why_unwritable(self, settings: Settings, engine: sa.Engine | None = None) -> str | None:
        """Why the data stores ``settings`` names cannot be written by this process (the
        start refuses then, naming it: bug XQ), or None where nothing says so. Asked at
        every start, before any store is opened; what it cannot reach (a server that
        does not answer) is left to the start, which tells it as before. ``engine``: as
        ``holds_a_deployment``'s."""
        ...

    def database_missing(self, settings: Settings, error: BaseException) -> bool:
        """Whether ``error``, raised connecting to the stores of ``settings``, is the
        server's answer that the database it names does not exist (not an outage: bug
        XC). Asked only after a failure, so a start that works pays nothing."""
        ...

    def hold_open(self, engine: sa.Engine) -> Callable[[], None]:
        """Mark the stores of ``engine`` (the views store) open by this process until the
        returned function is called: a shared lock every running process holds. Raises
        ``StoresInUseError`` at once while ``stores_alone`` holds them (a restore)."""
        ...

    def stores_alone(self, engine: sa.Engine) -> AbstractContextManager[None]:
        """Hold the stores of ``engine`` alone (``uprof restore``): no process may hold
        them open meanwhile. Raises ``StoresInUseError`` at once when one does."""
        ...


#: A dialect's ``insert`` (``sqlalchemy.dialects.postgresql.insert`` or ``...sqlite.insert``):
#: the two share SQLAlchemy's ``ON CONFLICT`` API, so each backend's upserts are built here.
DialectInsert = Callable[[Any], Any]


def upsert_with(
    insert: DialectInsert,
    table: sa.Table,
    rows: Sequence[Mapping[str, Any]],
    keys: Sequence[sa.Column[Any]],
    set_: Mapping[str, Any],
) -> sa.Executable:
    """``Backend.upsert`` built with the backend's dialect ``insert``."""
    statement: sa.Executable = (
        insert(table)
        .values(list(rows))
        .on_conflict_do_update(index_elements=list(keys), set_=dict(set_))
    )
    return statement


def upsert_from_with(
    insert: DialectInsert,
    table: sa.Table,
    select: sa.Select[Any],
    keys: Sequence[sa.Column[Any]],
) -> sa.Insert:
    """``Backend.upsert_from`` built with the backend's dialect ``insert``."""
    names = [column.name for column in select.selected_columns]
    statement = insert(table).from_select(names, select)
    key_names = {key.name for key in keys}
    upsert: sa.Insert = statement.on_conflict_do_update(
        index_elements=list(keys),
        set_={name: statement.excluded[name] for name in names if name not in key_names},
    )
    return upsert


#: The policy store's eventsourcing setting naming its snapshot recorder's class (read by
#: ``PolicyApplication``: the library has no setting for it).
SNAPSHOT_RECORDER_TOPIC = "SNAPSHOT_RECORDER_TOPIC"


def policy_recorders(backend: Backend) -> dict[str, str]:
    """The policy store's recorders, their row reads checked as the profiles log's: its
    reads under a running process went through the library's own, so a column renamed or
    of another type, or a row of another shape, was the store "unreadable", 503 "retry",
    or a traceback (0238-shapes-under-running-processes, bugs WS, WT)."""
    return {
        "APPLICATION_RECORDER_TOPIC": backend.checked_application_recorder_topic,
        SNAPSHOT_RECORDER_TOPIC: backend.snapshot_recorder_topic,
    }


def backend_named(scheme: str) -> Backend:
    """The backend registered for a SQLAlchemy backend name ("sqlite", "postgresql")."""
    target = REGISTRY.get(scheme)
    if target is None:
        raise ValueError(
            f"database_url: no storage backend for {scheme!r} URLs "
            f"(supported: {', '.join(sorted(REGISTRY))})"
        )
    module, _, attribute = target.partition(":")
    backend: Backend = getattr(importlib.import_module(module), attribute)
    return backend


#: What a URL's scheme may hold (RFC 3986 §3.1): only such a scheme is quoted back.
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]{0,40}$")


def scheme_of(url: str) -> str:
    """The backend part of a URL's scheme: ``postgresql+psycopg://`` -> ``postgresql``.

    A value that is not a URL is refused quoting none of it: libpq's other form of a
    connection string, keywords (``host=... password=... dbname=...``), was quoted
    whole, its password with it, on stderr (bug XW)."""
    scheme, sep, _ = url.partition("://")
    if not sep or not _SCHEME.match(scheme):
        raise ValueError(
            "database_url is not a database URL (postgresql+psycopg://USER@HOST:PORT/"
            "DATABASE); a libpq keyword string (host=... dbname=...) is not taken, and "
            "what was given is not repeated here: it may hold a password"
        )
    return scheme.split("+", 1)[0]


def backend_for_url(url: str) -> Backend:
    return backend_named(scheme_of(url))


def backend_for(engine: sa.Engine | sa.Connection) -> Backend:
    """The backend of an engine or connection uprof built."""
    return backend_named(engine.dialect.name)


def backend_for_settings(settings: Settings) -> Backend:
    url = settings.database_url
    return backend_named(EMBEDDED) if url is None else backend_for_url(url)
