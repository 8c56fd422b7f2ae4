"""Alembic is the schema's source: a database migrated to head matches the table code.

The tables are written twice, once as alembic revisions (what a deployment runs) and
once as SQLAlchemy ``Table`` objects (what the code queries). This is ``alembic check``
for both branches on both backends: migrate an empty database, then ask alembic's
autogenerate for the difference; any column, index, constraint or type that one side
has and the other lacks fails here instead of in production.

The third branch, ``events``, owns no table: only two partial indexes on the table
eventsourcing creates. Its drift check is that a store the event store opened holds
exactly the indexes the code's queries are written for, with the same conditions
(tests/kernel/test_events_migration.py checks the upgrade paths and the planner).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from audit.tables import metadata as audit_metadata
from projections.profile.tables import metadata as profile_metadata
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for
from uprof.apikeys.tables import metadata as api_metadata
from uprof.crypto.tables import metadata as keys_metadata
from uprof.eventstore import ProfilesApplication
from uprof.services.idempotency import metadata as idempotency_metadata
from uprof.storage import create_engine, migrate

BRANCHES = {
    "views": (profile_metadata, audit_metadata, idempotency_metadata),
    "keys": (keys_metadata, api_metadata),
}


def _combined(parts: tuple[sa.MetaData, ...]) -> sa.MetaData:
    combined = sa.MetaData()
    for md in parts:
        for table in md.tables.values():
            table.to_metadata(combined)
    return combined


def _drift(url: str, branch: str) -> list[object]:
    engine = create_engine(url)
    try:
        migrate(engine, branch)
        target = _combined(BRANCHES[branch])
        owned = set(target.tables)

        def include_object(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
            # Other branches' tables and eventsourcing's own share the database on PostgreSQL.
            if type_ == "table":
                return name in owned
            table = getattr(obj, "table", None)
            return table is None or table.name in owned

        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "include_object": include_object,
                    "target_metadata": target,
                },
            )
            return list(compare_metadata(context, target))
    finally:
        engine.dispose()


def test_views_migrations_match_the_table_code(empty_backend: Backend) -> None:
    assert _drift(empty_backend.url, "views") == []


def test_keys_migrations_match_the_table_code(empty_backend: Backend) -> None:
    assert _drift(empty_backend.url, "keys") == []


def test_events_migrations_match_the_event_store_code(empty_backend: Backend) -> None:
    k = build_kernel(settings_for(empty_backend), FakeClock())
    try:
        app = k.app
        engine = app.events_engine
        code = {name: app._head_condition(t) for name, t in ProfilesApplication._HEAD_INDEXES}
        table, _ = app.backend.head_index_target()
        with engine.connect() as conn:
            indexes = sa.inspect(conn).get_indexes(table)
        ours = {ix["name"]: ix for ix in indexes if str(ix["name"]).startswith("uprof_")}
        assert set(ours) == set(code)
        with engine.connect() as conn:
            for name, condition in code.items():
                topic = condition.split("'")[1]
                # The index's predicate, as the database stored it, names the code's topic.
                if engine.dialect.name == "sqlite":
                    stored = conn.execute(
                        sa.text("SELECT sql FROM sqlite_master WHERE name = :n"), {"n": name}
                    ).scalar_one()
                else:
                    stored = conn.execute(
                        sa.text("SELECT indexdef FROM pg_indexes WHERE indexname = :n"),
                        {"n": name},
                    ).scalar_one()
                assert f"'{topic}'" in stored
                assert ("<>" in stored) == ("<>" in condition)
    finally:
        k.close()


def test_the_check_sees_a_column_the_migrations_lack(empty_backend: Backend) -> None:
    """The check above can fail: a column added only in code is reported."""
    engine = create_engine(empty_backend.url)
    try:
        migrate(engine, "keys")
        target = _combined(BRANCHES["keys"])
        extra = next(iter(target.tables.values()))
        extra.append_column(sa.Column("only_in_code", sa.Integer, nullable=True))
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"compare_type": True, "target_metadata": target}
            )
            diff = compare_metadata(context, target)
        added = [d for d in diff if isinstance(d, tuple) and d[0] == "add_column"]
        assert [d[3].name for d in added] == ["only_in_code"]
    finally:
        engine.dispose()
