"""The event store's tables of the wrong shape, met at start (0220-event-table-shape-at-start).
Real ``uprof`` processes (a CLI command and ``uprof serve``), SQLite and PostgreSQL.

eventsourcing reads each row of its event and snapshot tables by name from ``SELECT *``
(``row["topic"]``): such a column renamed or dropped by hand is an ``IndexError``
(SQLite) or ``KeyError`` (PostgreSQL) inside the library, which no driver names, so
0214-store-damage-in-servers's driver rule never saw it. Before this, a start on such a
store went on (a CLI command that reads no event exited 0, ``uprof serve`` listened and
its pipeline logged a traceback per run), and a capture ended in the library's traceback
(exit 1) or a running server's 500 ``internal``. The start now refuses it: exit 7, one
line naming the table and the column, the restore hint, no traceback, for the CLI and the
servers before they listen.

Bug TQ: an event table's column the library reads by name (``topic``, ``state``, and
PostgreSQL's ``notification_id``). Bug TR: the snapshot table's (nothing read it before a
subject's hundredth event: every start and capture went on). Bug TS: the tracking
table's (named in the library's statements: renamed, exit 7 naming no table; dropped on
SQLite, the library took the table for one to migrate and ended in its traceback, exit 1).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path
from uuid import uuid4

import pytest
import sqlalchemy as sa

from benchmarks.server_ready import stop_server, wait_until_healthy
from tests.children import serving_child
from tests.conftest import Backend
from tests.e2e.test_store_damage_servers import (
    _UNHANDLED,
    CAPTURE,
    Served,
    _count_events,
    _damaged,
    served,  # noqa: F401  (the fixture)
)
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import consented_settings, running
from tests.kernel.test_review_0141 import _uprof
from uprof.settings import Settings

#: The event store's tables by hand: SQLite's ``events.sqlite``, PostgreSQL's database.
TABLES = {
    "sqlite": {"events": "stored_events", "snapshots": "stored_snapshots", "tracking": "tracking"},
    "postgres": {
        "events": "profiles_events",
        "snapshots": "profiles_snapshots",
        "tracking": "profiles_tracking",
    },
}

#: (bug, table kind, column, how): one per column class. ``drop`` where the backend lets a
#: column go (SQLite keeps primary key and indexed columns: those are renamed).
DAMAGES = [
    pytest.param("TQ", "events", "topic", "rename", id="TQ-events-topic-renamed"),
    pytest.param("TQ", "events", "state", "drop", id="TQ-events-state-dropped"),
    pytest.param("TR", "snapshots", "topic", "rename", id="TR-snapshots-topic-renamed"),
    pytest.param("TR", "snapshots", "state", "drop", id="TR-snapshots-state-dropped"),
    pytest.param("TS", "tracking", "notification_id", "rename", id="TS-tracking-renamed"),
    pytest.param("TS", "tracking", "notification_id", "drop", id="TS-tracking-dropped"),
]


def _alter(backend: Backend, settings: Settings, table: str, column: str, how: str) -> None:
    """Rename (or rename back) or drop ``column`` of ``table`` by hand, through the
    driver (never open(): FIELD-NOTES 8.1)."""
    statement = {
        "rename": f"ALTER TABLE {table} RENAME COLUMN {column} TO {column}_by_hand",
        "rename-back": f"ALTER TABLE {table} RENAME COLUMN {column} TO "
        + column.removesuffix("_by_hand"),
        "drop": f"ALTER TABLE {table} DROP COLUMN {column}",
    }[how]
    if backend.kind == "sqlite":
        conn = sqlite3.connect(settings.data_dir / "events.sqlite")
        try:
            conn.execute(statement)
            conn.commit()
        finally:
            conn.close()
        return
    engine = sa.create_engine(backend.url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(statement))
    finally:
        engine.dispose()


def _refused(
    backend: Backend, table: str, column: str, done: subprocess.CompletedProcess[str]
) -> None:
    """Exit 7, one error line naming the table and its column, the restore hint."""
    said = " ".join((done.stdout + done.stderr).split())
    assert "Traceback" not in said and "Error:" not in said, said[-2000:]
    assert done.returncode == 7, (done.returncode, said[-2000:])
    assert said.startswith("error: stored data damaged: the event store"), said[-2000:]
    assert f"its table {table} lacks the column(s) {column}" in said, said[-2000:]
    assert "uprof restore" in said, said[-2000:]


def _deployment(backend: Backend) -> Settings:
    """alice consented, one capture stored: the event table has rows to read."""
    settings = consented_settings(backend)
    done = _uprof(
        settings,
        "capture",
        *("--subject", "alice", "--app", "app:planner", "--agent", "agent:one"),
        *("--text", "I like green tea"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return settings


def _serve(settings: Settings, log: Path) -> tuple[int | None, str]:
    """Start ``uprof serve`` on ``settings``: (its exit code, its stderr) once it ended by
    itself, or (None, stderr) if it became healthy (then stopped): within a generous bound
    either way, never a fixed sleep."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPROF_")}
    env |= {
        "HF_HUB_OFFLINE": "1",
        "UPROF_DATA_DIR": str(settings.data_dir),
        "UPROF_EMBEDDER": "hashing",
        "UPROF_EXTRACTOR": "rules",
        "COLUMNS": "400",
    }
    if settings.database_url:
        env["UPROF_DATABASE_URL"] = settings.database_url
    # Forked from the tests' fork server (the project imported once), a process of its
    # own all the same: its start, its refusal and exit code are the command's.
    process, port = serving_child(["serve", "--log-level", "warning"], env, log)
    try:
        wait_until_healthy(process, f"http://127.0.0.1:{port}", timeout_s=120)
    except RuntimeError:
        code: int | None = process.wait(timeout=60)
    else:
        code = None
    finally:
        stop_server(process)
    return code, log.read_text(encoding="utf-8", errors="replace")


@pytest.mark.parametrize(("bug", "kind", "column", "how"), DAMAGES)
def test_a_damaged_event_store_is_refused_at_start_naming_table_and_column(
    backend: Backend, tmp_path: Path, bug: str, kind: str, column: str, how: str
) -> None:
    """Bugs TQ-TS: a CLI command and ``uprof serve`` on an event store one of whose
    tables lacks a column the library reads: refused at start, exit 7, one line naming
    the table and column. On main a command that reads no event exited 0, and the
    server listened."""
    settings = _deployment(backend)
    table = TABLES[backend.kind][kind]
    _alter(backend, settings, table, column, how)
    _refused(backend, table, column, _uprof(settings, "apps", "list"))
    code, log = _serve(settings, tmp_path / "serve.stderr")
    said = " ".join(log.split())
    assert code == 7, (code, said[-2000:])
    assert "Traceback" not in said, said[-2000:]
    assert f"its table {table} lacks the column(s) {column}" in said, said[-2000:]


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_tq_postgres_notification_id_of_the_event_table_is_refused_at_start(
    backend: Backend,
) -> None:
    """Bug TQ (PostgreSQL only: SQLite's notification ids are the rowid): the event
    table's ``notification_id``, which the library reads by name from ``SELECT *``."""
    settings = _deployment(backend)
    table = TABLES["postgres"]["events"]
    _alter(backend, settings, table, "notification_id", "rename")
    _refused(backend, table, "notification_id", _uprof(settings, "apps", "list"))


def test_held_a_store_of_the_right_shape_starts_and_captures(backend: Backend) -> None:
    """Held: the check refuses nothing on a store as uprof made it (a second start of a
    deployment with rows in every table it reads)."""
    settings = _deployment(backend)
    done = _uprof(
        settings,
        "capture",
        *("--subject", "alice", "--app", "app:planner", "--agent", "agent:one"),
        *("--text", "I like black tea"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert _uprof(settings, "apps", "list").returncode == 0


@pytest.fixture
def server(served: Served) -> Served:  # noqa: F811  (test_store_damage_servers's fixture)
    return served


@pytest.mark.parametrize("column", ["topic", "state"])
def test_tt_a_column_read_by_name_renamed_under_a_running_server_is_damage(
    backend: Backend, server: Served, column: str
) -> None:
    """Bug TT: the event table's ``topic`` or ``state`` renamed by hand while ``uprof
    serve`` runs. A capture loads the subject's stream with ``SELECT *`` and the library
    meets the missing column as an ``IndexError``/``KeyError``: on main 500 ``internal``
    and a traceback per request (and per pipeline run). Now: the recorder looks at the
    table when its row read fails so; the column is missing, so it is damage (500
    ``stored_data_damaged``, the hint, logged once naming the column, no traceback), and
    nothing is written."""
    table = TABLES[backend.kind]["events"]
    before = _count_events(backend, server.settings)
    _alter(backend, server.settings, table, column, "rename")
    for _ in range(2):
        answer = server.post(*CAPTURE)
        _damaged(answer)
        assert column not in answer.text and table not in answer.text, answer.text
    log = server.log()
    assert not any(line in log for line in _UNHANDLED), log[-3000:]
    # PostgreSQL's pipeline may log one traceback of its own first: its prepared
    # statement's plan after the table changed (0214-store-damage-in-servers's Left).
    tracebacks = log.count("Traceback")
    assert tracebacks == log.count("cached plan must not change result type"), log[-3000:]
    shape_lines = [line for line in log.splitlines() if "is not of the shape uprof made" in line]
    assert len(shape_lines) == 1 and f"column {column} missing" in shape_lines[0], log[-3000:]
    assert "uprof restore" in shape_lines[0], shape_lines
    _alter(backend, server.settings, table, f"{column}_by_hand", "rename-back")
    assert _count_events(backend, server.settings) == before


@pytest.mark.parametrize("read", ["select_events", "select_notifications"])
def test_held_a_lookup_error_of_a_row_read_with_every_column_there_stays_a_fault(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, read: str
) -> None:
    """Held (TT's other side): an ``IndexError``/``KeyError`` out of the library's row
    read while the table has every column it reads is not called damage: the recorder
    looks, finds them all, and the error goes on as it was (a fault, 500 ``internal``)."""
    settings = _deployment(backend)
    with running(settings, FakeClock()) as kernel:
        recorder = kernel.app.recorder
        # The library's recorder the guard extends (not uprof's row check between them).
        library = next(
            c for c in type(recorder).__mro__ if c.__module__.startswith("eventsourcing")
        )

        def broken(self: object, *args: object, **kwargs: object) -> object:
            raise KeyError("a bug, not the table")

        monkeypatch.setattr(library, read, broken)
        with pytest.raises(KeyError, match="a bug, not the table"):
            if read == "select_events":
                recorder.select_events(uuid4())
            else:
                recorder.select_notifications(start=None, limit=10)
