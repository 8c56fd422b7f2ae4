"""Processes that start at the same moment on a new store all come up.

Each start migrates three alembic branches (views, keys, events) and lets eventsourcing
create its tables. Alembic's "no version table yet: create it" is a read then a write, so
without a lock between processes all but one of them failed on a new SQLite store ("table
alembic_version already exists"); PostgreSQL queues them on an advisory lock. The
backend's ``schema_lock`` orders them on both.

Switching a new SQLite file into WAL mode is the one lock SQLite does not wait for: while
another process holds the file's write lock (switching it too, for a moment) the switch
fails at once, "database is locked", and a start on a new store failed once in CI (bug KA).
``test_a_new_store_file_opens_while_another_process_holds_its_write_lock`` stretches
that moment.
"""

from __future__ import annotations

import sqlite3
import time
import traceback
from pathlib import Path

import pytest

from tests import children
from tests.conftest import Backend
from uprof.settings import Settings
from uprof.storage import layout_for, open_engines, policy_store_env

STARTS = 3
#: How long another process holds a new store file's write lock: the moment a switch into
#: WAL takes, stretched; well within WAL_SWITCH's patience (about 5 s).
HOLD_S = 1.0


def _start(data_dir: str, url: str | None, barrier: object, results: object) -> None:
    try:
        from tests.fakes.ports import FakeClock
        from tests.kernel.conftest import build_kernel
        from uprof.settings import Settings

        settings = Settings(data_dir=Path(data_dir), database_url=url, embedder="hashing")
        # Bounded: a sibling that failed before it would leave this one waiting for ever.
        barrier.wait(120)  # type: ignore[attr-defined]
        build_kernel(settings, FakeClock()).close()
        results.put("ok")  # type: ignore[attr-defined]
    except Exception:
        # The whole traceback: a failure once in thousands of runs must name the statement
        # that failed, not only the error (bug KA was first seen as "database is locked").
        results.put(traceback.format_exc())  # type: ignore[attr-defined]


def starts_at_once(data_dir: Path, backend: Backend) -> list[str]:
    """STARTS processes start the deployment in ``data_dir`` (on ``backend``'s database)
    at the same moment: each one's ``ok`` or its error, in the order they finished."""
    context = children.CONTEXT
    barrier, results = context.Barrier(STARTS), context.Queue()
    url = backend.url if backend.kind == "postgres" else None
    processes = [
        context.Process(target=_start, args=(str(data_dir), url, barrier, results))
        for _ in range(STARTS)
    ]
    for process in processes:
        process.start()
    # Read before joining (multiprocessing's "joining processes that use queues"): a join
    # before the queued answers are read can deadlock.
    outcomes = [results.get(timeout=300) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    return outcomes


def test_processes_starting_at_once_on_a_new_store_all_come_up(empty_backend: Backend) -> None:
    assert starts_at_once(empty_backend.data_dir / "data", empty_backend) == ["ok"] * STARTS


def _hold_write_lock(database: str, held: object) -> None:
    # A process holding the write lock of a new store file, not yet in WAL mode: what a
    # process starting beside another does for the moment its own switch into WAL takes.
    connection = sqlite3.connect(database, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        held.set()  # type: ignore[attr-defined]
        time.sleep(HOLD_S)
        connection.execute("COMMIT")
    finally:
        connection.close()


def _open_as_a_start_does(settings: Settings, store: str) -> None:
    """Open one store file the way a start first opens it: an engine of ``open_engines``,
    or eventsourcing's own connection pool with the settings uprof hands it."""
    if store in ("views", "keys", "events"):
        engines = open_engines(layout_for(settings))
        try:
            with getattr(engines, store).connect() as conn:
                conn.exec_driver_sql("SELECT 1")
        finally:
            engines.dispose()
        return
    from eventsourcing.sqlite import SQLiteDatastore

    env = (
        layout_for(settings).eventsourcing_env
        if store == "events-by-eventsourcing"
        else policy_store_env(settings)
    )
    datastore = SQLiteDatastore(env["SQLITE_DBNAME"], lock_timeout=30)
    try:
        with datastore.transaction(commit=False) as cursor:
            cursor.execute("SELECT 1")
    finally:
        datastore.close()


@pytest.mark.parametrize(
    ("store", "file"),
    [
        ("views", "data/views.sqlite"),
        ("keys", "data.keys/keys.sqlite"),
        ("events", "data/events.sqlite"),
        ("events-by-eventsourcing", "data/events.sqlite"),
        ("policies-by-eventsourcing", "data/policies.sqlite"),
    ],
)
def test_a_new_store_file_opens_while_another_process_holds_its_write_lock(
    tmp_path: Path, store: str, file: str
) -> None:
    """Every store file a start opens, by every opener (uprof's engines, eventsourcing's
    pool): opening a new file while another real process holds its write lock waits for
    it, never fails at the switch into WAL mode (bug KA: "database is locked" at once, not
    after the busy timeout; a start on a new store failed so once in CI)."""
    settings = Settings(data_dir=tmp_path / "data", embedder="hashing")
    database = tmp_path / file
    database.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    held = children.CONTEXT.Event()
    holder = children.CONTEXT.Process(target=_hold_write_lock, args=(str(database), held))
    holder.start()
    try:
        assert held.wait(60), "the holder did not take the write lock"
        _open_as_a_start_does(settings, store)  # raised "database is locked" on main
    finally:
        holder.join(timeout=60)
    assert holder.exitcode == 0
