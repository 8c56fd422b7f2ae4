"""Review of decision 0184: attacks on NR (SQLite result codes read as outage or fault)
that held, kept as tests. The defects found (OF to OJ) have their own files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from eventsourcing import persistence as es_persistence

from uprof.api.errors import store_outage


def _raised_by_eventsourcing(connection: sqlite3.Connection, statement: str) -> Exception:
    """The error the event store's recorder (``eventsourcing.sqlite``) raises for
    ``statement``: the driver's ``OperationalError`` wrapped in the library's, as it wraps
    it (``raise OperationalError(e) from e``), not SQLAlchemy's with ``orig``."""
    try:
        try:
            connection.execute(statement)
        except sqlite3.OperationalError as error:
            raise es_persistence.OperationalError(error) from error
    except es_persistence.OperationalError as wrapped:
        return wrapped
    raise AssertionError(f"{statement!r} did not fail")


def test_the_event_stores_missing_table_is_a_fault(tmp_path: Path) -> None:
    """NR held for the event store's own driver path (eventsourcing's wrapper, the cause
    in ``__cause__``): a table renamed away is a fault (500), not "retry later"."""
    connection = sqlite3.connect(tmp_path / "events.sqlite")
    try:
        error = _raised_by_eventsourcing(connection, "SELECT * FROM stored_events")
    finally:
        connection.close()
    assert store_outage(error) is None


def test_the_event_store_locked_past_its_wait_is_an_outage(tmp_path: Path) -> None:
    """NR held: the same wrapper around SQLITE_BUSY (another process holds the write lock
    past the wait) is an outage (503)."""
    path = tmp_path / "events.sqlite"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE stored_events (x)")
    holder.execute("BEGIN EXCLUSIVE")
    waiter = sqlite3.connect(path, timeout=0)
    try:
        error = _raised_by_eventsourcing(waiter, "SELECT * FROM stored_events")
    finally:
        waiter.close()
        holder.execute("ROLLBACK")
        holder.close()
    assert store_outage(error) is not None


@pytest.mark.parametrize(
    ("code", "outage"),
    [
        (sqlite3.SQLITE_IOERR | (1 << 8), True),  # SQLITE_IOERR_READ: an extended I/O code
        (sqlite3.SQLITE_BUSY | (2 << 8), True),  # SQLITE_BUSY_SNAPSHOT
        (sqlite3.SQLITE_CORRUPT, False),  # a damaged file: waiting does not mend it
        (sqlite3.SQLITE_NOTADB, False),
        (sqlite3.SQLITE_ERROR | (1 << 8), False),  # SQLITE_ERROR_MISSING_COLLSEQ
    ],
    ids=["ioerr-read", "busy-snapshot", "corrupt", "notadb", "error-extended"],
)
def test_extended_codes_are_read_by_their_primary_code(code: int, outage: bool) -> None:
    """NR held: an extended result code is read by its primary code (the low byte)."""
    cause = sqlite3.OperationalError("x")
    cause.sqlite_errorcode = code  # type: ignore[attr-defined]
    try:
        raise es_persistence.OperationalError(cause) from cause
    except es_persistence.OperationalError as wrapped:
        assert (store_outage(wrapped) is not None) is outage
