"""Review of 0224-review-of-0220-and-0223 and the store-shape leftovers of 0220 and 0224,
by attack (0228-review-of-0224-and-store-shapes). Real ``uprof`` processes and live
``uprof serve`` on loopback, SQLite and PostgreSQL, tables altered by hand through the
driver.

Bug UY: 0224's UO reads a statement PostgreSQL refused as a stale plan again once; each
pooled connection holds its own prepared statement, and the pool hands them out in turn,
so the one re-read met the next stale connection and the refusal escaped.
Bug UZ: a column of the event store of a type uprof did not make (``state`` or a version
turned to TEXT) went past the start check, which compared names only.
Bug VA: the same under a running server: 500 ``internal`` and a traceback per request.
Bug VB: the policy store's start check looked at its events table's columns missing only:
its snapshot table, a column of the wrong type and, on SQLite, a column more went by.
Bug VC: ``uprof restore``, the policy store's hint, kept such a live policy store as it was.
"""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Backend
from tests.e2e.test_event_table_shape import TABLES, _alter, _deployment, _serve
from tests.e2e.test_review_of_0220 import _alter_by_hand
from tests.e2e.test_review_of_0220 import snapshotted as snapshotted  # the fixture
from tests.e2e.test_store_damage_servers import (
    _UNHANDLED,
    CAPTURE,
    Served,
    _count_events,
    _damaged,
)
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running
from tests.kernel.test_review_0141 import _uprof
from uprof.settings import Settings

CAPTURE_BY_CLI = (
    "capture",
    *("--subject", "alice", "--app", "app:planner", "--agent", "agent:one"),
    *("--text", "I like black tea"),
)


def _said(done: subprocess.CompletedProcess[str]) -> str:
    return " ".join((done.stdout + done.stderr).split())


def _recreated_with(settings: Settings, file: str, table: str, column: str, declared: str) -> None:
    """SQLite, which alters no column's type: ``table`` of ``file`` made again by hand
    with ``column`` declared ``declared``, its rows copied (as an operator "fixing" a
    table would), in one transaction: done statement by statement, a running server's
    worker could meet the table missing between the rename and the copy, another damage
    than the one the tests make (seen once in a run of the 0238 tests)."""
    conn = sqlite3.connect(settings.data_dir / file, isolation_level=None)
    try:
        made = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchone()[0]
        kept = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? "
            "AND sql IS NOT NULL",
            (table,),
        ).fetchall()
        columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
        declared_now = {row[1]: row[2] for row in conn.execute(f"PRAGMA table_info({table})")}
        remade = made.replace(f"{column} {declared_now[column]}", f"{column} {declared}", 1)
        assert remade != made, made
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(f"ALTER TABLE {table} RENAME TO {table}_old")
        conn.execute(remade)
        names = ", ".join(columns)
        conn.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM {table}_old")
        conn.execute(f"DROP TABLE {table}_old")
        for (index,) in kept:
            conn.execute(index)
        conn.execute("COMMIT")
    finally:
        conn.close()


def _retyped(backend: Backend, settings: Settings, table: str, column: str) -> None:
    """``column`` of the event store's ``table`` turned to TEXT by hand."""
    if backend.kind == "sqlite":
        _recreated_with(settings, "events.sqlite", table, column, "TEXT")
        return
    using = "encode(state, 'hex')" if column == "state" else f"{column}::text"
    _alter_by_hand(
        backend, settings, f"ALTER TABLE {table} ALTER COLUMN {column} TYPE text USING {using}"
    )


#: (table kind, column) turned to TEXT, per backend. SQLite converts a value on write by
#: its column's affinity (a version under TEXT reads back "1"); a blob it never converts,
#: so its ``state`` under TEXT still works and is not here (held below).
RETYPED = {
    "sqlite": [("events", "originator_version"), ("tracking", "notification_id")],
    "postgres": [
        ("events", "state"),
        ("events", "originator_version"),
        ("events", "notification_id"),
        ("snapshots", "state"),
        ("tracking", "notification_id"),
    ],
}


def _retyped_cases() -> list[object]:
    return [
        pytest.param(kind, table_kind, column, id=f"{kind}-{table_kind}-{column}")
        for kind, cases in RETYPED.items()
        for table_kind, column in cases
    ]


@pytest.mark.parametrize(("backend", "kind", "column"), _retyped_cases(), indirect=["backend"])
def test_uz_a_column_of_another_type_is_refused_at_start(
    backend: Backend, tmp_path: Path, kind: str, column: str
) -> None:
    """Bug UZ: an event store column turned to TEXT by hand. 0220's check compared
    names: on main a command that reads no event went on (exit 0; PostgreSQL's
    ``notification_id``: every command a ``TypeError`` traceback, exit 1) and a capture
    ended in the library's traceback (exit 1). Now refused at start, exit 7, naming the
    table and the column with its type, and ``serve`` does not listen."""
    settings = _deployment(backend)
    table = TABLES[backend.kind][kind]
    _retyped(backend, settings, table, column)
    for command in (("apps", "list"), CAPTURE_BY_CLI):
        said = _said(done := _uprof(settings, *command))
        assert "Traceback" not in said and "Error:" not in said, said[-2000:]
        assert done.returncode == 7, (done.returncode, said[-2000:])
        assert said.startswith("error: stored data damaged: the event store"), said[-2000:]
        assert f"its table {table} has the column(s) {column} (" in said, said[-2000:]
        assert "of a type uprof did not make" in said and "uprof restore" in said, said
    code, log = _serve(settings, tmp_path / "serve.stderr")
    assert code == 7, (code, log[-2000:])
    assert "Traceback" not in log, log[-2000:]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_held_sqlite_a_state_column_made_again_as_text_still_works(backend: Backend) -> None:
    """Held (UZ's other side, SQLite): a blob is never converted by a column's affinity,
    so the event table's ``state`` made again as TEXT keeps working: not refused (a
    working store is not damage), and a capture is written and read back."""
    settings = _deployment(backend)
    _recreated_with(settings, "events.sqlite", "stored_events", "state", "TEXT")
    before = _count_events(backend, settings)
    for command in (("apps", "list"), CAPTURE_BY_CLI, CAPTURE_BY_CLI):
        done = _uprof(settings, *command)
        assert done.returncode == 0, _said(done)[-2000:]
    assert _count_events(backend, settings) > before


# --- VB: the policy store's tables ------------------------------------------------------

#: The policy store's tables by hand: SQLite's ``policies.sqlite``, PostgreSQL's database.
POLICY_TABLES = {
    "sqlite": {"events": "stored_events", "snapshots": "stored_snapshots"},
    "postgres": {"events": "policies_events", "snapshots": "policies_snapshots"},
}


def _on_policy_store(backend: Backend, settings: Settings, statement: str) -> None:
    if backend.kind == "sqlite":
        conn = sqlite3.connect(settings.data_dir / "policies.sqlite")
        try:
            conn.execute(statement)
            conn.commit()
        finally:
            conn.close()
        return
    _alter_by_hand(backend, settings, statement)


#: (id, backend, table kind, statement, what the refusal names).
POLICY_DAMAGES = [
    pytest.param(
        "sqlite",
        "events",
        "ALTER TABLE {t} ADD COLUMN note TEXT",
        "has the column(s) note uprof did not make",
        id="sqlite-events-column-more",
    ),
    pytest.param(
        "sqlite",
        "snapshots",
        "ALTER TABLE {t} ADD COLUMN note TEXT",
        "has the column(s) note uprof did not make",
        id="sqlite-snapshots-column-more",
    ),
    pytest.param(
        "sqlite",
        "snapshots",
        "ALTER TABLE {t} RENAME COLUMN topic TO topic_by_hand",
        "lacks the column(s) topic",
        id="sqlite-snapshots-topic-renamed",
    ),
    pytest.param(
        "postgres",
        "snapshots",
        "ALTER TABLE {t} RENAME COLUMN topic TO topic_by_hand",
        "lacks the column(s) topic",
        id="postgres-snapshots-topic-renamed",
    ),
    pytest.param(
        "postgres",
        "snapshots",
        "ALTER TABLE {t} DROP COLUMN state",
        "lacks the column(s) state",
        id="postgres-snapshots-state-dropped",
    ),
    pytest.param(
        "postgres",
        "events",
        "ALTER TABLE {t} ALTER COLUMN state TYPE text USING encode(state, 'hex')",
        "has the column(s) state (text) of a type uprof did not make",
        id="postgres-events-state-text",
    ),
]


@pytest.mark.parametrize(
    ("backend", "kind", "statement", "named"), POLICY_DAMAGES, indirect=["backend"]
)
def test_vb_a_policy_table_not_of_the_shape_uprof_made_is_refused_at_start(
    backend: Backend, tmp_path: Path, kind: str, statement: str, named: str
) -> None:
    """Bug VB: RF's start check of the policy store looked at its events table, for a
    column missing. On main: the snapshot table renamed or dropped went by (exit 0; met
    at the hundredth policy version), a column more on SQLite went by until the first
    policy change (exit 7 then, no table named), and ``state`` turned to TEXT on
    PostgreSQL was the library's ``TypeError`` traceback, exit 1, for every command.
    Now every start refuses it: exit 7, the table and column named, the restore hint."""
    from tests.policies.test_policy_store_tampered import _deployment as policy_deployment

    settings = policy_deployment(backend)
    table = POLICY_TABLES[backend.kind][kind]
    _on_policy_store(backend, settings, statement.format(t=table))
    for command in (("policy", "show"), ("apps", "list")):
        said = _said(done := _uprof(settings, *command))
        assert "Traceback" not in said, said[-2000:]
        assert done.returncode == 7, (command, done.returncode, said[-2000:])
        assert said.startswith("error: policy store damaged"), said[-2000:]
        assert f"its table {table} {named}" in said and "uprof restore" in said, said[-2000:]
    code, log = _serve(settings, tmp_path / "serve.stderr")
    assert code == 7, (code, log[-2000:])
    assert "Traceback" not in log, log[-2000:]


# --- VA: a column of another type under a running server --------------------------------


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
@pytest.mark.parametrize("column", ["state", "originator_version"])
def test_va_a_column_retyped_under_a_running_server_is_damage(
    backend: Backend, snapshotted: Served, column: str
) -> None:
    """Bug VA (PostgreSQL, where one ``ALTER COLUMN ... TYPE`` does it under a running
    process): the event table's ``state`` or ``originator_version`` turned to TEXT while
    ``uprof serve`` runs. On main every capture of alice was 500 ``internal`` and a
    traceback (the library's ``bytes(row["state"])`` ``TypeError``; "operator does not
    exist: text > smallint"). Now the recorder looks at the table when its read fails:
    the column is of another type, so 500 ``stored_data_damaged``, logged once naming
    the column, nothing written, no request's traceback."""
    served = snapshotted
    table = TABLES[backend.kind]["events"]
    before = _count_events(backend, served.settings)
    _retyped(backend, served.settings, table, column)
    for _ in range(2):
        answer = served.post(*CAPTURE)
        _damaged(answer)
        assert column not in answer.text and table not in answer.text, answer.text
    log = served.log()
    assert not any(line in log for line in _UNHANDLED), log[-3000:]
    shape_lines = [line for line in log.splitlines() if "is not of the shape uprof made" in line]
    assert len(shape_lines) == 1, log[-3000:]
    assert f"column {column} of another type" in shape_lines[0], shape_lines
    assert "uprof restore" in shape_lines[0], shape_lines
    assert _count_events(backend, served.settings) == before


# --- UY: a stale prepared plan on more than one pooled connection ----------------------


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_uy_a_column_added_is_read_past_every_pooled_connections_stale_plan(
    backend: Backend,
) -> None:
    """Bug UY: 0224's UO reads a statement PostgreSQL refused ("cached plan must not
    change result type") once more. Every connection of the log's pool prepared the
    read on its own, and the pool hands its idle connections out in turn: the one
    re-read took the next connection, whose plan was as stale, and the refusal escaped
    (a request's 500 ``internal``, the pipeline's traceback per connection). Here every
    idle connection has read alice's stream before a column is added by hand; the next
    read must return her events."""
    settings = _deployment(backend)
    with running(settings, FakeClock()) as kernel:
        recorder = kernel.app.recorder
        stream = kernel.stream_of("alice")
        pool = recorder.datastore.pool
        held = [pool.getconn() for _ in range(3)]  # the pool holds three or more
        for conn in held:
            pool.putconn(conn)
        idle = int(pool.get_stats()["pool_available"])
        assert idle >= 3, pool.get_stats()
        events = recorder.select_events(stream)
        for _ in range(idle):  # each idle connection, in turn, prepares the read
            assert recorder.select_events(stream) == events
        _alter_by_hand(
            backend, settings, f"ALTER TABLE {TABLES['postgres']['events']} ADD COLUMN note TEXT"
        )
        assert recorder.select_events(stream) == events
        assert recorder.select_events(stream) == events


# --- Held: the operator's remedies, the tables no start check looks at ----------------

#: (table kind, column, how) per backend: damages of 0220's, 0224's and this record's.
REMEDIED = [
    pytest.param("events", "topic", "rename", id="events-topic-renamed"),
    pytest.param("snapshots", "state", "drop", id="snapshots-state-dropped"),
    pytest.param("events", "originator_version", "retype", id="events-version-text"),
    pytest.param("events", "note", "add", id="events-column-added"),
]


@pytest.mark.parametrize(("kind", "column", "how"), REMEDIED)
def test_held_restore_of_a_backup_taken_before_the_damage_gets_the_store_back(
    backend: Backend, tmp_path: Path, kind: str, column: str, how: str
) -> None:
    """Held (0220's and 0224's Left): the documented remedy. A backup taken before the
    damage, the event store damaged by hand, every start refused (exit 7); ``uprof
    projections rebuild`` is refused the same way (it reads the log: no remedy, and
    changes nothing); ``uprof restore --from`` the backup puts the backup's tables in
    place, and the next start's check sees them: commands start, a capture is written,
    a rebuild reads every event. SQLite and PostgreSQL, real processes."""
    settings = _deployment(backend)
    backup = tmp_path / "backup"
    done = _uprof(settings, "backup", "--to", str(backup))
    assert done.returncode == 0, _said(done)
    before = _count_events(backend, settings)
    table = TABLES[backend.kind][kind]
    if how == "retype":
        _retyped(backend, settings, table, column)
    elif how == "add":
        _alter_by_hand(backend, settings, f"ALTER TABLE {table} ADD COLUMN {column} TEXT")
    else:
        _alter(backend, settings, table, column, how)
    refused = ("apps", "list"), ("projections", "rebuild")
    if how == "add" and backend.kind == "postgres":
        refused = ()  # a column more is no damage there (0224's held test)
    for command in refused:
        said = _said(done := _uprof(settings, *command))
        assert done.returncode == 7 and "Traceback" not in said, (command, said[-2000:])
        assert f"its table {table}" in said and "uprof restore" in said, said[-2000:]
    done = _uprof(settings, "restore", "--from", str(backup))
    assert done.returncode == 0, _said(done)[-2000:]
    assert _count_events(backend, settings) == before
    for command in (("apps", "list"), CAPTURE_BY_CLI, ("projections", "rebuild")):
        done = _uprof(settings, *command)
        assert done.returncode == 0, (command, _said(done)[-2000:])
    assert _count_events(backend, settings) > before


#: Tables of the views and key stores (alembic's: every statement names its columns).
UNCHECKED = (
    "audit_entries",
    "idempotency_keys",
    "captures",
    "consents",
    "shredded_streams",
    "projection_tracking",
    "subject_keys",
    "subject_index",
    "stream_heads",
    "capture_keys",
    "erased_keys",
)


def test_held_a_column_added_to_a_table_no_start_check_looks_at_is_no_fault(
    backend: Backend,
) -> None:
    """Held: a nullable column added by hand to the audit, idempotency, capture, consent,
    erasure and key store tables (alembic's, whose statements name their columns): no
    start is refused, and a command, a capture, an erasure and a rebuild succeed, no
    traceback."""
    settings = _deployment(backend)
    for table in UNCHECKED:
        statement = f"ALTER TABLE {table} ADD COLUMN note_by_hand TEXT"
        if backend.kind == "postgres":
            _alter_by_hand(backend, settings, statement)
            continue
        files = (settings.data_dir / "views.sqlite", settings.key_path / "keys.sqlite")
        added = 0
        for file in files:
            conn = sqlite3.connect(file)
            try:
                if conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
                ).fetchone():
                    conn.execute(statement)
                    conn.commit()
                    added += 1
            finally:
                conn.close()
        assert added == 1, table
    for command in (
        ("apps", "list"),
        CAPTURE_BY_CLI,
        ("projections", "run"),
        ("audit", "entries"),
        ("erase", "subject", "--subject", "alice"),
        ("projections", "rebuild"),
    ):
        said = _said(done := _uprof(settings, *command))
        assert done.returncode == 0 and "Traceback" not in said, (command, said[-2000:])


#: (backend, table kind, statement): a policy table damaged by hand, per backend.
POLICY_REMEDIED = [
    pytest.param(
        "sqlite", "events", "ALTER TABLE {t} ADD COLUMN note TEXT", id="sqlite-column-more"
    ),
    pytest.param(
        "postgres",
        "snapshots",
        "ALTER TABLE {t} RENAME COLUMN topic TO topic_by_hand",
        id="postgres-snapshots-topic-renamed",
    ),
]


@pytest.mark.parametrize(("backend", "kind", "statement"), POLICY_REMEDIED, indirect=["backend"])
def test_vc_restore_on_a_policy_table_of_the_wrong_shape_names_the_way_out(
    backend: Backend, tmp_path: Path, kind: str, statement: str
) -> None:
    """Bug VC: the policy store's damage hint says "restore it from a backup (uprof
    restore)", but a restore keeps the live policy store as it is (a backup taken before
    a revocation must not grant again): on main it exited 0 and left the damaged table in
    place, so what failed before failed after (SQLite: every policy change exit 7;
    PostgreSQL's snapshot table: unseen until the hundredth version). Now the restore
    refuses to keep it, as a damaged live policy (HS), naming the table and the way to
    take the backup's policy; done that way, the next start and a policy change succeed."""
    from tests.policies.test_policy_store_tampered import _deployment as policy_deployment

    settings = policy_deployment(backend)
    backup = tmp_path / "backup"
    assert (done := _uprof(settings, "backup", "--to", str(backup))).returncode == 0, _said(done)
    table = POLICY_TABLES[backend.kind][kind]
    _on_policy_store(backend, settings, statement.format(t=table))
    said = _said(done := _uprof(settings, "restore", "--from", str(backup)))
    assert done.returncode != 0 and "Traceback" not in said, said[-2000:]
    assert "the live policy store is damaged" in said and f"its table {table}" in said, said
    if backend.kind == "sqlite":
        assert "Move policies.sqlite out of the data folder" in said, said[-2000:]
        (settings.data_dir / "policies.sqlite").rename(tmp_path / "policies.sqlite.damaged")
    else:
        assert "drop both tables" in said, said[-2000:]
        _alter_by_hand(backend, settings, "DROP TABLE policies_events, policies_snapshots")
    done = _uprof(settings, "restore", "--from", str(backup))
    assert done.returncode == 0, _said(done)[-2000:]
    grant = ("policy", "grant", "--role", "role:assistant", "--action", "read")
    grant += ("--category", "any", "--purpose", "support")
    for command in (("apps", "list"), grant, ("policy", "show")):
        said = _said(done := _uprof(settings, *command))
        assert done.returncode == 0 and "Traceback" not in said, (command, said[-2000:])
