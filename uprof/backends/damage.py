"""Stored data the driver says is damaged: a SQLite file that is not a database (or whose
pages are damaged), or a table of the wrong shape (a column uprof made is missing) on
either backend. One rule for the CLI, the servers and the policy store's
check (0203-review-of-0199-and-0201's QH, 0214-store-damage-in-servers's SG-SI): not an
outage (waiting mends nothing), not a fault of uprof's; the operator restores the stores.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from domain.errors import StoredDataDamagedError, StoreFileDamagedError, StoreShapeDamagedError

_log = logging.getLogger(__name__)

#: SQLite's codes for a file that is not a database, or whose pages are damaged.
_DAMAGE_CODES = frozenset({sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT})
#: SQLite's messages for a column uprof's statements name but the table lacks. SQLite
#: gives them the generic code (SQLITE_ERROR), shared with a malformed statement, which
#: stays a fault: the text is the only difference (stable across SQLite versions). A
#: table missing altogether is not here: a table renamed away under a running process
#: is the store not answering (503), as docs/operations.md has said since bug PX.
_SQLITE_SHAPE_MESSAGES = ("no such column:", "has no column named")
#: SQLite's message for a positional insert (eventsourcing's ``INSERT INTO t VALUES
#: (?,?,?,?)``) into a table given a column more by hand ("table t has 5 columns but 4
#: values were supplied"): every write of that table fails (0224-review-of-0220-and-0223,
#: bug UP). Generic code again; the text is the difference.
_SQLITE_MORE_COLUMNS = re.compile(r"table (\w+) has \d+ columns but \d+ values were supplied")
#: PostgreSQL's SQLSTATE for the same: undefined_column.
_POSTGRES_SHAPE_STATES = frozenset({"42703"})
#: Names no table, column or value: the driver's text names the store's schema.
_SHAPE = (
    "stored data damaged: a table of the stores is not of the shape uprof made (a column "
    "it reads is missing, or of another type, or a row is of another shape)"
)
#: The same for a column more, where the library writes rows by position (SQLite).
_SHAPE_MORE = (
    "stored data damaged: a table of the stores is not of the shape uprof made (it has a "
    "column more, and its rows are written by position)"
)

#: The missing column in the driver's text (SQLite's two messages; PostgreSQL's
#: ``column "x" does not exist``, ``column x.y does not exist``, ``column "x" of relation
#: "t" does not exist``): its last name, without the table's.
_MISSING_COLUMN = re.compile(r'(?:no such column: |has no column named |column )"?([\w.]+)"?')


#: The most of a driver's text a log line carries (a damaged file's schema may be long).
_DETAIL_MAX = 300


def _one_line(text: str) -> str:
    """``text`` for one log line: control characters and anything not ASCII escaped
    (a newline shows as ``\\n``, never ends the line), at most ``_DETAIL_MAX`` of it."""
    escaped = text.encode("unicode_escape").decode("ascii")
    return escaped if len(escaped) <= _DETAIL_MAX else f"{escaped[:_DETAIL_MAX]}..."


def _shape_damage(driver_text: str) -> StoreShapeDamagedError:
    """A table of the wrong shape; its ``detail`` names the missing column for the log
    (one line per column: two different damages were one line naming neither, TE)."""
    damage = StoreShapeDamagedError(_SHAPE)
    found = _MISSING_COLUMN.search(driver_text)
    damage.detail = f"column {found.group(1).rsplit('.', 1)[-1]} missing" if found else ""
    return damage


def store_damage(error: BaseException) -> StoredDataDamagedError | None:
    """The refusal for ``error`` when the driver says a store is damaged (its file, or a
    table's shape), else None. Read through SQLAlchemy's and eventsourcing's wrappers;
    a shape damage the event store's recorder found itself (``row_read_damage``) is
    itself."""
    if isinstance(error, StoreShapeDamagedError):
        return error
    cause = getattr(error, "orig", None) or error.__cause__ or error
    if isinstance(cause, sqlite3.DatabaseError):
        code = getattr(cause, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF in _DAMAGE_CODES:
            # The driver's text goes to the log alone, escaped: it may quote the file's
            # schema ("malformed database schema (<name>) - <its SQL>"), whatever a
            # damaged file holds, newlines included (0219-review-of-0216-and-tf, TZ).
            damaged = StoreFileDamagedError(
                f"stored data damaged: a SQLite store of the data folder is not a database "
                f"or is damaged ({getattr(cause, 'sqlite_errorname', code)})"
            )
            damaged.detail = _one_line(str(cause))
            return damaged
        if isinstance(cause, sqlite3.OperationalError) and any(
            words in str(cause) for words in _SQLITE_SHAPE_MESSAGES
        ):
            return _shape_damage(str(cause))
        if isinstance(cause, sqlite3.OperationalError) and (
            more := _SQLITE_MORE_COLUMNS.search(str(cause))
        ):
            damage = StoreShapeDamagedError(_SHAPE_MORE)
            damage.detail = f"table {more.group(1)} has a column more"
            return damage
        return None
    if getattr(cause, "sqlstate", None) in _POSTGRES_SHAPE_STATES:
        # The primary message alone: the full text quotes the statement.
        return _shape_damage(getattr(getattr(cause, "diag", None), "message_primary", "") or "")
    return None


#: The columns eventsourcing reads each row of an event or snapshot table by, by name
#: from ``SELECT *`` (``row["topic"]``): one renamed or dropped by hand is an
#: ``IndexError`` (SQLite's rows) or ``KeyError`` (PostgreSQL's) inside the library, which
#: no driver's text names; a running server answered 500 ``internal`` with a traceback.
EVENT_ROW_COLUMNS = frozenset({"originator_id", "originator_version", "topic", "state"})
#: The columns of the library's tracking table (a process's position per application).
TRACKING_COLUMNS = frozenset({"application_name", "notification_id"})

#: Whether a column's declared type (as the backend's catalog says it) gives the library
#: back the value it wrote: ``Backend.column_type_fits``.
TypeFits = Callable[[str, str], bool]


def shape_faults(
    table: str,
    wanted: frozenset[str],
    there: Mapping[str, str],
    fits: TypeFits,
    *,
    exactly: bool = False,
) -> list[str]:
    """What is wrong with ``table`` (``there``: its columns and their declared types), one
    phrase per kind, naming the columns: a column of ``wanted`` missing, or of a type
    ``fits`` refuses (a column made again, or altered, by hand as TEXT where the library
    keeps an integer or bytes reads back a value its code cannot use: a ``TypeError`` of
    its own, or the driver's "operator does not exist";
    0228-review-of-0224-and-store-shapes, UZ); with ``exactly``, a column more
    (``Backend.writes_rows_by_position``, 0224-review-of-0220-and-0223, UP)."""
    said = []
    if lacking := sorted(wanted - set(there)):
        said.append(f"its table {table} lacks the column(s) {', '.join(lacking)}")
    mistyped = sorted(c for c in wanted & set(there) if not fits(c, there[c]))
    if mistyped:
        kinds = ", ".join(f"{c} ({there[c] or 'no type'})" for c in mistyped)
        said.append(f"its table {table} has the column(s) {kinds} of a type uprof did not make")
    if exactly and (more := sorted(set(there) - wanted)):
        said.append(
            f"its table {table} has the column(s) {', '.join(more)} uprof did not make "
            "(its rows are written by position)"
        )
    return said


def reshaped_tables(
    wanted: Mapping[str, frozenset[str]],
    found: Mapping[str, Mapping[str, str]],
    fits: TypeFits,
    *,
    exactly: bool = False,
) -> list[str]:
    """``shape_faults`` of each table of ``wanted`` that is there (``found``: the columns
    and types there, ``Backend.table_columns``). A table not in ``found`` is left alone:
    a missing table is the store not answering (503), as since PX, or made by the
    library. One rule for the event store's start check and the policy store's."""
    said: list[str] = []
    for table, columns in wanted.items():
        there = found.get(table)
        if there is not None:
            said += shape_faults(table, columns, there, fits, exactly=exactly)
    return said


def refuse_reshaped_tables(
    wanted: Mapping[str, frozenset[str]],
    found: Mapping[str, Mapping[str, str]],
    fits: TypeFits,
    *,
    exactly: bool = False,
) -> None:
    """Raise ``StoreShapeDamagedError`` naming each table of the event store that is
    not of the shape uprof made (``reshaped_tables``), for the operator at start
    (0214-store-damage-in-servers's Left, the event store's counterpart of RF's policy
    table check)."""
    said = reshaped_tables(wanted, found, fits, exactly=exactly)
    if not said:
        return
    damage = StoreShapeDamagedError(
        f"stored data damaged: the event store is not of the shape uprof made: {'; '.join(said)} "
        "(altered by hand, or made again by hand)"
    )
    damage.detail = "; ".join(said)
    raise damage


def row_read_damage(
    read_by_name: frozenset[str], there: Mapping[str, str], fits: TypeFits
) -> StoreShapeDamagedError | None:
    """What an error out of the library's row read is, once the table was looked at
    (``there``: its columns and their types now): damage when a column it reads by name
    is missing or of a type it cannot use (the answer names none; ``detail`` names the
    column for the log), else None, and the error stays a fault. Told apart by the look,
    not by the error's text: a lookup failing inside the library's read of ``SELECT *``
    with every column there, of its type, is a bug. The damage is logged here, once
    (``log_store_damage``): it surfaces as uprof's own error, which no surface's
    driver-error handler sees."""
    if not there:
        # No table at all (renamed away, dropped): the store not answering, as since PX
        # (503), not a table of the wrong shape; the error stays what it was.
        return None
    lacking = sorted(read_by_name - set(there))
    mistyped = sorted(c for c in read_by_name & set(there) if not fits(c, there[c]))
    if not lacking and not mistyped:
        return None
    damage = StoreShapeDamagedError(_SHAPE)
    damage.detail = "; ".join(
        [f"column {', '.join(lacking)} missing"] * bool(lacking)
        + [f"column {', '.join(mistyped)} of another type"] * bool(mistyped)
    )
    log_store_damage(damage)
    return damage


def rows_of_another_shape(rows: Iterable[Any]) -> bool:
    """Whether a row the library read back is not of the shape it writes: a version that
    is not an integer, a topic not text, a state not bytes. SQLite hands on what a column
    made again by hand converted (a version under TEXT reads back ``"1"``), and either
    backend a NULL put in by hand: the library's aggregate code or uprof's mapper then
    fails outside the read, naming nothing (0238-shapes-under-running-processes, bugs
    WQ, WS). A type look per row, no statement."""
    return any(
        type(row.originator_version) is not int
        or type(row.topic) is not str
        or type(row.state) is not bytes
        for row in rows
    )


def row_shape_damage(table: str) -> StoreShapeDamagedError:
    """The damage of a row of ``table`` not of the shape the library writes, its columns
    all there and of their types (``rows_of_another_shape``): altered by hand. Logged
    once naming the table; the answer names none."""
    damage = StoreShapeDamagedError(_SHAPE)
    damage.detail = f"a row of table {table} of another shape"
    log_store_damage(damage)
    return damage


_reported: set[str] = set()
_reported_lock = threading.Lock()


def log_store_damage(damage: StoredDataDamagedError) -> None:
    """Log ``damage`` with what the operator must do, once per process for each kind and
    ``detail`` (the missing column): a server meets it on every request until the stores
    are restored, and a line per request (with the driver's traceback, as before) buried
    the one that says what to do."""
    said = f"{damage} ({damage.detail})" if damage.detail else str(damage)
    with _reported_lock:
        first = said not in _reported
        _reported.add(said)
    if first:
        _log.error("%s; every request that reads it is refused: %s", said, damage.hint)


def log_fault_or_damage(
    log: logging.Logger, error: BaseException, message: str, *args: object
) -> str:
    """Log a background failure (the server's pipeline run, ``uprof worker``'s batch, the
    capture writer's group): stored data damaged once, with what the operator must do
    (``log_store_damage``; every retry meets it again until the stores are restored, and
    a traceback each time buried it), any other failure as ``message`` with its
    traceback. Returns the class to show (the damage's, not the driver's)."""
    damage = store_damage(error)
    if damage is None:
        log.error(message, *args, exc_info=error)
        return type(error).__name__
    log_store_damage(damage)
    return type(damage).__name__
