"""Store shapes under running processes, and the policy store's run-time reads
(0238-shapes-under-running-processes; 0228-review-of-0224-and-store-shapes's Left). Live
``uprof serve`` on loopback, SQLite and PostgreSQL, tables altered by hand through the
driver while the server runs.

Bug WQ: SQLite alters no column's type, so an operator makes the table again; a version
column made again as TEXT under a running process reads back ``"1"``, which the
library's aggregate code meets outside the recorder's read: 500 ``internal`` and a
traceback per request until the next start refused it.
Bug WR (``tests/kernel/test_write_into_a_retyped_column.py``; held here as served):
PostgreSQL, a write into a column altered to another type under a running process.
Bugs WS, WT: the policy store's run-time reads went through the library's own recorders:
a column renamed or of another type, or a row of another shape, under a running server
was the store "unreadable" (503 "retry") or a traceback, or went unseen by the checks
while the policy's own routes failed.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.by_hand import by_hand
from tests.children import served_from_fork
from tests.conftest import Backend
from tests.e2e.test_review_of_0224 import POLICY_TABLES, _recreated_with
from tests.e2e.test_store_damage_servers import (
    _UNHANDLED,
    APP,
    CAPTURE,
    CONSENTS,
    _count_events,
    _damaged,
)
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import consent, consented_settings, running, say
from uprof.settings import Settings

SLICE = (
    "/v1/slices",
    {
        "subject": "alice",
        "query": "tea?",
        "budget_tokens": 256,
        "purpose": "personalization",
        "agent_id": "agent:one",
    },
)
#: A new subject's first write (its consent): no row of its stream to read before it.
FIRST_WRITE = (
    "/v1/consents",
    {
        "subject": "carol",
        "categories": ["*"],
        "purposes": ["personalization"],
        "collected_by": "consent-ui:test",
    },
)
#: What the server logs where the damage's one line belongs.
TRACEBACKS = (*_UNHANDLED, "Traceback", "policy store unreadable")


@dataclass
class Live:
    url: str
    app: dict[str, str]
    operator: dict[str, str]
    settings: Settings
    stderr: Path

    def post(self, path: str, body: dict[str, Any], *, operator: bool = False) -> httpx.Response:
        headers = self.operator if operator else self.app
        return httpx.post(f"{self.url}{path}", json=body, headers=headers, timeout=120)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", headers=self.operator, timeout=120)

    def log(self) -> str:
        return self.stderr.read_text(encoding="utf-8", errors="replace")


def _prepared(backend: Backend, *, policy_snapshot: bool) -> Settings:
    """alice (and bob) consented to ``APP``, one capture of alice's stored; with
    ``policy_snapshot``, the tenant's policy stream snapshotted (its next load reads the
    snapshot table first)."""
    from domain.policy import policy_id

    settings = consented_settings(backend)
    with running(settings, FakeClock()) as kernel:
        consent(kernel, "bob")
        kernel.capture("alice", say("I like green tea"))
        if policy_snapshot:
            kernel.policy.app.take_snapshot(policy_id(settings.tenant))
    return settings


def _serve(settings: Settings, stderr: Path) -> Iterator[Live]:
    from uprof.api import ApiKeyStore

    keys = ApiKeyStore.open(settings)
    try:
        app = keys.create(APP).token
        operator = keys.create(APP, ["app", "operator"]).token
    finally:
        keys.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPROF_")}
    env |= {
        "HF_HUB_OFFLINE": "1",
        "UPROF_DATA_DIR": str(settings.data_dir),
        "UPROF_EMBEDDER": "hashing",
        "UPROF_EXTRACTOR": "rules",
        "UPROF_POLICY_REFRESH_S": "0",  # each check looks at the policy store
    }
    if settings.database_url:
        env["UPROF_DATABASE_URL"] = settings.database_url
    # Forked from the tests' fork server (the project imported once): a process of its
    # own all the same, its start the command's; held past the test's body, stopped here.
    with served_from_fork(env, stderr) as url:
        live = Live(
            url,
            {"Authorization": f"Bearer {app}"},
            {"Authorization": f"Bearer {operator}"},
            settings,
            stderr,
        )
        assert live.post(*CONSENTS).status_code == 200
        assert live.get("/v1/policy").status_code == 200
        yield live


@pytest.fixture
def live(backend: Backend, tmp_path: Path) -> Iterator[Live]:
    yield from _serve(_prepared(backend, policy_snapshot=False), tmp_path / "serve.stderr")


@pytest.fixture
def live_policy_snapshot(backend: Backend, tmp_path: Path) -> Iterator[Live]:
    yield from _serve(_prepared(backend, policy_snapshot=True), tmp_path / "serve.stderr")


def _no_traceback(live: Live) -> str:
    log = live.log()
    assert not any(line in log for line in TRACEBACKS), log[-3000:]
    return log


def _count(backend: Backend, settings: Settings, file: str, table: str) -> int:
    if backend.kind == "sqlite":
        conn = sqlite3.connect(settings.data_dir / file)
        try:
            return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
        finally:
            conn.close()
    engine = sa.create_engine(backend.url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())
    finally:
        engine.dispose()


def _written(backend: Backend, settings: Settings) -> dict[str, int]:
    """The rows a capture or a consent writes to the log and its views."""
    counted = {"events": _count_events(backend, settings)}
    return counted | {
        table: _count(backend, settings, "views.sqlite", table)
        for table in ("captures", "consents")
    }


# --- WQ: a SQLite column made again as another type under a running server -------------


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("table", ["stored_events", "stored_snapshots"])
def test_wq_a_sqlite_version_column_made_again_as_text_under_a_server_is_damage(
    backend: Backend, live: Live, table: str
) -> None:
    """Bug WQ: the event (or snapshot) table of ``events.sqlite`` made again by hand with
    ``originator_version`` TEXT, rows copied, while ``uprof serve`` runs. On main: 500
    ``internal`` and a traceback per capture (the library's ``version + 1`` on "1"),
    until the next start refused it. Now the first request answers the damage (500
    ``stored_data_damaged``), logged once naming the column, nothing written."""
    if table == "stored_snapshots":  # alice's next load reads her snapshot first
        with running(live.settings, FakeClock()) as kernel:
            kernel.app.take_snapshot(kernel.stream_of("alice"))
    before = _written(backend, live.settings)
    _recreated_with(live.settings, "events.sqlite", table, "originator_version", "TEXT")
    for _ in range(2):
        answer = live.post(*CAPTURE)
        _damaged(answer)
        assert "originator_version" not in answer.text and table not in answer.text
    log = _no_traceback(live)
    lines = [line for line in log.splitlines() if "is not of the shape uprof made" in line]
    assert len(lines) == 1, log[-3000:]
    assert "column originator_version of another type" in lines[0], lines
    assert _written(backend, live.settings) == before


# --- WR: a PostgreSQL write into a column of another type, served ----------------------


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_wr_a_served_first_write_into_a_column_retyped_is_damage_nothing_logged(
    backend: Backend, live: Live
) -> None:
    """Bug WR, served: ``profiles_events.state`` altered to text while ``uprof serve``
    runs, then a new subject's consent (her stream's first write). Where the pooled
    connection the request takes had prepared the stream read, the read meets the stale
    plan and is told as damage before the write (0228's VA); where it had not, on main,
    the read found no row and the write went in, stored as text, 201 (one of two runs on
    main: timing). Now the write looks at the table's types: 500
    ``stored_data_damaged``, logged once naming the column, nothing written to the log or
    its views (the subject's key and index row, made before the write as for any first
    write, stay: 0227's UT reads a subject as there only once its stream holds events).
    The deterministic road is ``tests/kernel/test_write_into_a_retyped_column.py``."""
    before = _written(backend, live.settings)
    by_hand(
        backend,
        live.settings,
        "events.sqlite",
        "ALTER TABLE profiles_events ALTER COLUMN state TYPE text USING encode(state, 'hex')",
    )
    for _ in range(2):
        answer = live.post(*FIRST_WRITE)
        _damaged(answer)
        assert "state" not in answer.text and "profiles_events" not in answer.text
    log = _no_traceback(live)
    lines = [line for line in log.splitlines() if "is not of the shape uprof made" in line]
    assert len(lines) == 1, log[-3000:]
    assert "column state of another type" in lines[0], lines
    assert _written(backend, live.settings) == before


# --- WS, WT: the policy store under a running server --------------------------------------


def _policy_statements(backend: Backend, attack: str) -> list[str]:
    """What the attack does by hand to the policy store's tables."""
    events, snapshots = (
        POLICY_TABLES[backend.kind]["events"],
        POLICY_TABLES[backend.kind]["snapshots"],
    )
    text = "TEXT" if backend.kind == "sqlite" else "text"
    newest = f"(SELECT max(originator_version) FROM {events})"
    return {
        "topic-renamed": [f"ALTER TABLE {events} RENAME COLUMN topic TO topic_by_hand"],
        "state-renamed": [f"ALTER TABLE {events} RENAME COLUMN state TO state_by_hand"],
        "snapshot-state-renamed": [f"ALTER TABLE {snapshots} RENAME COLUMN state TO state_by_hand"],
        "state-retyped": [
            f"ALTER TABLE {events} ALTER COLUMN state TYPE text USING encode(state, 'hex')"
        ],
        "version-retyped": [
            f"ALTER TABLE {events} ALTER COLUMN originator_version TYPE {text} "
            "USING originator_version::text"
        ],
        "state-null": [f"UPDATE {events} SET state = NULL WHERE originator_version = {newest}"],
        "topic-null": [f"UPDATE {events} SET topic = NULL WHERE originator_version = {newest}"],
        "version-text": [
            f"UPDATE {events} SET originator_version = 'v' || originator_version "
            f"WHERE originator_version = {newest}"
        ],
        "snapshot-truncated": [f"UPDATE {snapshots} SET state = substr(state, 1, 3)"],
        "snapshot-state-null": [f"UPDATE {snapshots} SET state = NULL"],
    }[attack]


#: (backend, attack, whether the policy needs a snapshot).
POLICY_ATTACKS = [
    *(
        pytest.param(kind, attack, False, id=f"{kind}-{attack}")
        for kind in ("sqlite", "postgres")
        for attack in ("topic-renamed", "state-renamed", "state-null", "topic-null")
    ),
    pytest.param("postgres", "state-retyped", False, id="postgres-state-retyped"),
    pytest.param("postgres", "version-retyped", False, id="postgres-version-retyped"),
    pytest.param("sqlite", "version-retyped", False, id="sqlite-version-retyped"),
    pytest.param("sqlite", "version-text", False, id="sqlite-version-text"),
    *(
        pytest.param(kind, attack, True, id=f"{kind}-{attack}")
        for kind in ("sqlite", "postgres")
        for attack in ("snapshot-state-renamed", "snapshot-truncated", "snapshot-state-null")
    ),
]


def _attack_policy(backend: Backend, settings: Settings, attack: str) -> None:
    if backend.kind == "sqlite" and attack == "version-retyped":
        _recreated_with(settings, "policies.sqlite", "stored_events", "originator_version", "TEXT")
        return
    by_hand(backend, settings, "policies.sqlite", *_policy_statements(backend, attack))


def _every_policy_checked_route_answers_the_damage(backend: Backend, live: Live) -> None:
    before = _written(backend, live.settings)
    answers = {
        "policy": live.get("/v1/policy"),
        "history": live.get("/v1/policy/history"),
        "grant": live.post(
            "/v1/policy/grant",
            {
                "role": "role:assistant",
                "actions": ["read"],
                "categories": ["any"],
                "purpose": "support",
            },
            operator=True,
        ),
        "capture": live.post(*CAPTURE),
        "slice": live.post(*SLICE),
        "capture again": live.post(*CAPTURE),
    }
    said = {route: (a.status_code, a.text[:160]) for route, a in answers.items()}
    assert all(a.status_code == 500 for a in answers.values()), said
    for answer in answers.values():
        _damaged(answer)
    _no_traceback(live)
    assert _written(backend, live.settings)["events"] == before["events"]


@pytest.mark.parametrize(
    ("backend", "attack", "snapshot"),
    [p for p in POLICY_ATTACKS if not p.values[2]],
    indirect=["backend"],
)
def test_ws_a_policy_table_altered_under_a_server_is_damage_on_every_route(
    backend: Backend, live: Live, attack: str, snapshot: bool
) -> None:
    """Bug WS: the policy store's events table altered by hand while ``uprof serve`` runs
    (a column renamed, of another type, a row of another shape). On main the policy's
    routes answered 500 ``internal`` (show, history) and 503 "policy store unreadable"
    (a grant), with tracebacks, while captures (201) and slices (200) went on allowed by
    the policy read before (the checks look at the head, which did not move). Now every
    policy-checked route answers 500 ``stored_data_damaged``: never 403, never 503
    "retry", never a traceback, and nothing is written."""
    _attack_policy(backend, live.settings, attack)
    _every_policy_checked_route_answers_the_damage(backend, live)


@pytest.mark.parametrize(
    ("backend", "attack", "snapshot"),
    [p for p in POLICY_ATTACKS if p.values[2]],
    indirect=["backend"],
)
def test_wt_a_policy_snapshot_altered_under_a_server_is_damage_on_every_route(
    backend: Backend, live_policy_snapshot: Live, attack: str, snapshot: bool
) -> None:
    """Bug WT: the policy store's snapshot table altered by hand while ``uprof serve``
    runs (a column renamed, a row cut short, a row's state gone): the policy's next load
    reads it first. On main the policy's routes met it (500 ``internal``, 503, or the
    row's failed tag) while captures and slices went on allowed. Now every
    policy-checked route answers the damage."""
    _attack_policy(backend, live_policy_snapshot.settings, attack)
    _every_policy_checked_route_answers_the_damage(backend, live_policy_snapshot)
