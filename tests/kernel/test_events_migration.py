"""The head indexes on eventsourcing's events table come from the alembic ``events`` branch.

Issue 17: alembic is the only schema source. eventsourcing creates its own tables; our
two partial indexes on its events table (``uprof_head_*``, decision 0007) were created at
run time until this branch. Here: a new store ends at the branch head with both indexes;
a store an older release wrote (indexes created at run time, no ``events`` revision)
upgrades to the head without a second copy; a store at the head opens without alembic;
and the read path's queries carry exactly the indexes' conditions, so the planner uses
them.
"""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic import command

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for
from uprof import eventstore
from uprof.eventstore import ProfilesApplication
from uprof.kernel import Uprof
from uprof.storage import branch_head

HEAD_REVISION = "0001_events_head_indexes"
migration = importlib.import_module(f"migrations.versions.{HEAD_REVISION}")


def _head_indexes(engine: sa.Engine) -> list[tuple[str, str]]:
    """(name, definition) of every index on the events table whose definition names topic."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            rows = conn.execute(
                sa.text(
                    "SELECT name, sql FROM sqlite_master WHERE type = 'index' "
                    "AND tbl_name = 'stored_events' AND sql IS NOT NULL"
                )
            )
        else:
            rows = conn.execute(
                sa.text(
                    "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'profiles_events'"
                )
            )
        return sorted((str(n), str(d)) for n, d in rows if "topic" in str(d))


def _revisions(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table("alembic_version"):
            return set()
        return {r[0] for r in conn.execute(sa.text("SELECT version_num FROM alembic_version"))}


@pytest.fixture
def backend(empty_backend: Backend) -> Backend:
    """Every test here starts from an empty store: first starts and upgrades are the point."""
    return empty_backend


@pytest.fixture
def opened(backend: Backend, clock: FakeClock) -> Iterator[Uprof]:
    k = build_kernel(settings_for(backend), clock)
    try:
        yield k
    finally:
        k.close()


def test_the_branch_head_is_this_revision() -> None:
    assert branch_head("events") == HEAD_REVISION


def test_a_new_store_ends_at_the_head_with_both_indexes(opened: Uprof) -> None:
    engine = opened.app.events_engine
    assert HEAD_REVISION in _revisions(engine)
    assert [n for n, _ in _head_indexes(engine)] == sorted(migration.HEAD_INDEXES)


def _open_the_old_way(backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Write a store as the release before the ``events`` branch did: eventsourcing's tables,
    then the indexes created at run time with the statement that release ran."""
    with monkeypatch.context() as m:
        m.setattr(eventstore, "migrate", lambda engine, branch: None)
        k = build_kernel(settings_for(backend), clock)
    try:
        app = k.app
        table, nid = app._events_table()
        columns = "originator_id" if nid == "rowid" else "originator_id, notification_id"
        with app.events_engine.begin() as conn:
            for name, template in ProfilesApplication._HEAD_INDEXES:
                conn.execute(
                    sa.text(
                        f"CREATE INDEX IF NOT EXISTS {name} ON {table} ({columns}) "
                        f"WHERE {app._head_condition(template)}"
                    )
                )
        assert HEAD_REVISION not in _revisions(app.events_engine)
        assert len(_head_indexes(app.events_engine)) == 2
    finally:
        k.close()


def test_a_store_with_run_time_indexes_upgrades_to_the_head_with_each_index_once(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    _open_the_old_way(backend, clock, monkeypatch)
    k = build_kernel(settings_for(backend), clock)
    try:
        engine = k.app.events_engine
        assert HEAD_REVISION in _revisions(engine)
        found = _head_indexes(engine)
        assert [n for n, _ in found] == sorted(migration.HEAD_INDEXES)  # each exactly once
    finally:
        k.close()


def test_a_store_at_the_head_opens_without_running_alembic(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_kernel(settings_for(backend), clock).close()

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("alembic ran on a store already at its heads")

    monkeypatch.setattr(command, "upgrade", refuse)
    k = build_kernel(settings_for(backend), clock)
    try:
        assert HEAD_REVISION in _revisions(k.app.events_engine)
    finally:
        k.close()


def test_the_fast_path_check_can_fail(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test above can fail: a store behind the head does run alembic."""
    _open_the_old_way(backend, clock, monkeypatch)
    ran: list[str] = []
    monkeypatch.setattr(command, "upgrade", lambda config, target: ran.append(target))
    build_kernel(settings_for(backend), clock).close()
    assert ran == ["events@head"]


def test_the_read_path_queries_carry_the_indexes_conditions(opened: Uprof) -> None:
    """The planner matches a partial index only to a query with the same condition: the
    event store's conditions must be the migration's, literally."""
    app = opened.app
    conditions = {
        name: app._head_condition(template) for name, template in ProfilesApplication._HEAD_INDEXES
    }
    assert conditions == migration.HEAD_INDEXES
    for condition in conditions.values():
        assert condition in app._heads_sql


def test_the_planner_uses_the_head_indexes(opened: Uprof) -> None:
    app = opened.app
    engine = app.events_engine
    table, nid = app._events_table()
    key = app.backend.stream_key(uuid.uuid4())
    with engine.connect() as conn:
        for name, template in ProfilesApplication._HEAD_INDEXES:
            query = (
                f"SELECT MAX({nid}) FROM {table} WHERE originator_id = :s "
                f"AND {app._head_condition(template)}"
            )
            if engine.dialect.name == "sqlite":
                plan = conn.execute(sa.text(f"EXPLAIN QUERY PLAN {query}"), {"s": key}).all()
            else:
                conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
                plan = conn.execute(
                    sa.text(f"EXPLAIN {query.replace(':s', 'CAST(:s AS uuid)')}"), {"s": key}
                ).all()
            assert name in " ".join(str(part) for row in plan for part in row), plan
