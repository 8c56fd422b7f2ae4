"""Review of 0220-event-table-shape-at-start and 0223-review-of-0218-and-0219 by attack
(0224-review-of-0220-and-0223). Real ``uprof`` processes, SQLite and PostgreSQL.

Bug UN: 0220 wrapped the event table's row reads (``select_events``,
``select_notifications``) so that a column renamed under a running process is damage,
but left the snapshot table's recorder the library's own. A subject with a snapshot is
loaded through it first: its ``topic`` or ``state`` renamed by hand under a running
server was, on main, 500 ``internal`` and the library's ``IndexError``/``KeyError``
traceback on every capture of that subject, the damage named nowhere.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.by_hand import by_hand
from tests.children import served_from_fork
from tests.conftest import Backend
from tests.e2e.test_event_table_shape import TABLES, _alter, _deployment, _serve
from tests.e2e.test_store_damage_servers import (
    _UNHANDLED,
    APP,
    CAPTURE,
    CONSENTS,
    Served,
    _count_events,
    _damaged,
)
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import consented_settings, running
from tests.kernel.test_review_0141 import _uprof
from uprof.settings import Settings


def _snapshot_of_alice(settings: Settings) -> None:
    """One capture of alice's and a snapshot of her stream, in a process of the test's
    own, before the server starts: her next load reads the snapshot table first."""
    from tests.kernel.conftest import say

    with running(settings, FakeClock()) as kernel:
        kernel.capture("alice", say("I like green tea"))
        kernel.app.take_snapshot(kernel.stream_of("alice"))


@pytest.fixture
def snapshotted(backend: Backend, tmp_path: Path) -> Iterator[Served]:
    """``uprof serve`` on a deployment where alice consented and has a snapshot."""
    from uprof.api import ApiKeyStore

    settings = consented_settings(backend)
    _snapshot_of_alice(settings)
    keys = ApiKeyStore.open(settings)
    try:
        token = keys.create(APP).token
    finally:
        keys.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPROF_")}
    env |= {
        "HF_HUB_OFFLINE": "1",
        "UPROF_DATA_DIR": str(settings.data_dir),
        "UPROF_EMBEDDER": "hashing",
        "UPROF_EXTRACTOR": "rules",
    }
    if settings.database_url:
        env["UPROF_DATABASE_URL"] = settings.database_url
    stderr = tmp_path / "serve.stderr"
    # Forked from the tests' fork server (the project imported once): a process of its
    # own all the same, its start the command's; held past the test's body, stopped here.
    with served_from_fork(env, stderr) as url:
        served = Served(url, {"Authorization": f"Bearer {token}"}, settings, stderr)
        assert served.post(*CONSENTS).status_code == 200
        yield served


@pytest.mark.parametrize("column", ["topic", "state"])
def test_un_a_snapshot_column_renamed_under_a_running_server_is_damage(
    backend: Backend, snapshotted: Served, column: str
) -> None:
    """Bug UN: the snapshot table's ``topic`` or ``state`` renamed by hand while ``uprof
    serve`` runs; alice has a snapshot, so a capture of hers reads it first. On main:
    500 ``internal``, a traceback per request. Now as TT's: 500 ``stored_data_damaged``,
    logged once naming the column, nothing written."""
    served = snapshotted
    table = TABLES[backend.kind]["snapshots"]
    before = _count_events(backend, served.settings)
    _alter(backend, served.settings, table, column, "rename")
    for _ in range(2):
        answer = served.post(*CAPTURE)
        _damaged(answer)
        assert column not in answer.text and table not in answer.text, answer.text
    log = served.log()
    assert not any(line in log for line in _UNHANDLED), log[-3000:]
    shape_lines = [line for line in log.splitlines() if "is not of the shape uprof made" in line]
    assert len(shape_lines) == 1 and f"column {column} missing" in shape_lines[0], log[-3000:]
    assert "uprof restore" in shape_lines[0], shape_lines
    _alter(backend, served.settings, table, f"{column}_by_hand", "rename-back")
    assert _count_events(backend, served.settings) == before


def _add_column(backend: Backend, settings: Settings, table: str) -> None:
    """A column of the operator's own added to ``table`` by hand (a column uprof does
    not read: the library's reads go on)."""
    _alter_by_hand(backend, settings, f"ALTER TABLE {table} ADD COLUMN note_by_hand TEXT")


def _alter_by_hand(backend: Backend, settings: Settings, statement: str) -> None:
    by_hand(backend, settings, "events.sqlite", statement)


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_uo_a_column_added_under_a_running_server_is_not_a_fault(
    backend: Backend, snapshotted: Served
) -> None:
    """Bug UO (PostgreSQL, whose library names the columns it writes): a column of the
    operator's own added by hand to the event and snapshot tables while ``uprof serve``
    runs. The library prepares its reads; PostgreSQL refuses a statement prepared before
    its table changed shape ("cached plan must not change result type"), once per
    connection. On main a capture meeting that was 500 ``internal`` with a traceback,
    though every column uprof reads is there. Now the recorder looks (nothing missing)
    and reads again: every capture is written, nothing logged as unhandled."""
    served = snapshotted
    assert served.post(*CAPTURE).status_code == 201  # alice's reads are prepared now
    before = _count_events(backend, served.settings)
    for kind in ("events", "snapshots"):
        _add_column(backend, served.settings, TABLES[backend.kind][kind])
    for _ in range(3):
        answer = served.post(*CAPTURE)
        assert answer.status_code == 201, answer.text
    assert _count_events(backend, served.settings) >= before + 3
    log = served.log()
    assert not any(line in log for line in _UNHANDLED), log[-3000:]
    assert "not of the shape" not in log, log[-3000:]
    # The pipeline's own read may log its retry (0214-store-damage-in-servers's Left:
    # its prepared statement's plan after the table changed); no request's failure.
    errors = [line for line in log.splitlines() if line.startswith("ERROR:")]
    assert all("pipeline run failed; retrying" in line for line in errors), errors


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_held_a_column_added_by_hand_is_not_refused_at_start(backend: Backend) -> None:
    """Held (PostgreSQL): 0220's start check refuses a table that lacks a column, not one
    with a column more, where the library names the columns it writes (every table of
    the event store given one): a CLI command and a capture start and succeed."""
    settings = _deployment(backend)
    for table in TABLES[backend.kind].values():
        _add_column(backend, settings, table)
    assert _uprof(settings, "apps", "list").returncode == 0
    done = _uprof(
        settings,
        "capture",
        *("--subject", "alice", "--app", "app:planner", "--agent", "agent:one"),
        *("--text", "I like black tea"),
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("kind", ["events", "snapshots", "tracking"])
def test_up_sqlite_a_column_added_by_hand_is_refused_at_start(
    backend: Backend, tmp_path: Path, kind: str
) -> None:
    """Bug UP (SQLite): eventsourcing writes rows there by position (``INSERT INTO t
    VALUES (?,?,?,?)``), so a column added by hand fails every write of the table
    ("table t has 5 columns but 4 values were supplied"). On main the start check let
    it by (it looks for columns missing only): ``apps list`` exited 0, ``serve``
    listened, and a capture ended in that traceback, exit 1. Now refused at start, exit
    7, naming the table and its column."""
    settings = _deployment(backend)
    table = TABLES[backend.kind][kind]
    _add_column(backend, settings, table)
    for command in (
        ("apps", "list"),
        (
            "capture",
            "--subject",
            "alice",
            "--app",
            "app:planner",
            "--agent",
            "agent:one",
            "--text",
            "I like black tea",
        ),
    ):
        done = _uprof(settings, *command)
        said = " ".join((done.stdout + done.stderr).split())
        assert "Traceback" not in said and "Error:" not in said, said[-2000:]
        assert done.returncode == 7, (done.returncode, said[-2000:])
        assert f"its table {table} has the column(s) note_by_hand uprof did not make" in said, said[
            -2000:
        ]
        assert "uprof restore" in said, said[-2000:]
    code, log = _serve(settings, tmp_path / "serve.stderr")
    assert code == 7, (code, log[-2000:])
    assert "Traceback" not in log, log[-2000:]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_up_sqlite_a_column_added_under_a_running_server_is_damage(
    backend: Backend, snapshotted: Served
) -> None:
    """Bug UP (SQLite), under a running server: a column added by hand to the event
    table fails every capture's positional insert. On main: 500 ``internal`` and a
    traceback per request. Now: 500 ``stored_data_damaged``, logged once naming the
    table, nothing written."""
    served = snapshotted
    table = TABLES[backend.kind]["events"]
    before = _count_events(backend, served.settings)
    _add_column(backend, served.settings, table)
    for _ in range(2):
        answer = served.post(*CAPTURE)
        _damaged(answer)
        assert table not in answer.text, answer.text
    log = served.log()
    assert not any(line in log for line in _UNHANDLED), log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    shape_lines = [line for line in log.splitlines() if "is not of the shape uprof made" in line]
    assert len(shape_lines) == 1 and f"table {table} has a column more" in shape_lines[0], log[
        -3000:
    ]
    assert _count_events(backend, served.settings) == before
