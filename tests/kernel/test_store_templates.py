"""The ``backend`` fixture's stores start from a schema template (tests/templates.py).

A template stands in for an empty store only if a first start on a copy of it ends
exactly where a first start on an empty store ends: the same tables, columns, indexes,
constraints and triggers, and the same rows (how many per table: keys and ids differ
from one start to the next). And it must hold no row of its own but the schema's
version: the check that guards each template built is shown to catch one.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from benchmarks.reliability import grant_all, interaction
from tests.conftest import (
    Backend,
    _admin,
    _create_pg_database,
    _drop_pg_database,
    _pg_url,
    store_from_template,
)
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for
from tests.templates import (
    PG_SCHEMA,
    PG_SEQUENCES,
    SQLITE_DATA,
    PgStores,
    SqliteTemplate,
    check_holds_only_schema,
    pg_schema,
)


def _rows(conn: sa.Connection, sql: str) -> list[tuple[object, ...]]:
    return sorted(tuple(r) for r in conn.execute(sa.text(sql)))


def _state(url: str) -> dict[str, object]:
    """The schema of the database at ``url``, and how many rows each of its tables holds."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                state: dict[str, object] = {
                    "schema": _rows(conn, "SELECT type, name, tbl_name, sql FROM sqlite_master")
                }
            else:
                state = {part: _rows(conn, sql) for part, sql in PG_SCHEMA.items()}
            state["rows"] = {
                table: conn.execute(sa.text(f'SELECT count(*) FROM "{table}"')).scalar_one()
                for table in sa.inspect(conn).get_table_names()
            }
            return state
    finally:
        engine.dispose()


def _stores(backend: Backend) -> dict[str, dict[str, object]]:
    """Each store of a deployment on ``backend`` (the fixtures' layout), by name."""
    if backend.kind == "postgres":
        return {"database": _state(backend.url)}
    root = backend.data_dir
    return {
        str(p.relative_to(root)): _state(f"sqlite:///{p}")
        for p in sorted(root.rglob("*.sqlite"))
        if p.name != "uprof.sqlite"  # the fixture's own URL, unused by a deployment
    }


def _first_start(backend: Backend) -> dict[str, dict[str, object]]:
    build_kernel(settings_for(backend), FakeClock()).close()
    return _stores(backend)


@pytest.fixture
def template_copy(
    empty_backend: Backend, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Backend]:
    """A store copied from the session's template, on the backend of ``empty_backend``."""
    folder = tmp_path_factory.mktemp("from-template")
    with store_from_template(request, empty_backend.kind, folder) as store:
        yield store


def _schema(stores: dict[str, dict[str, object]]) -> dict[str, dict[str, object]]:
    return {name: {k: v for k, v in state.items() if k != "rows"} for name, state in stores.items()}


def test_a_first_start_on_a_template_copy_ends_where_one_on_an_empty_store_does(
    empty_backend: Backend, template_copy: Backend
) -> None:
    copied = _stores(template_copy)
    from_template = _first_start(template_copy)
    from_empty = _first_start(empty_backend)
    assert from_template == from_empty
    # The template is complete: a first start on a copy has no table or index to add.
    assert _schema(copied) == _schema(from_template)
    # Not vacuous: the first start wrote rows (the policy seed, its audit entry, ...).
    written = [state["rows"] for state in from_empty.values()]
    assert any(n for rows in written if isinstance(rows, dict) for n in rows.values())


def test_a_template_copy_holds_no_row_but_the_schema_versions(template_copy: Backend) -> None:
    urls = (
        [template_copy.url]
        if template_copy.kind == "postgres"
        else [f"sqlite:///{p}" for p in template_copy.data_dir.rglob("*.sqlite")]
    )
    assert len(urls) == (1 if template_copy.kind == "postgres" else 4)  # SQLite: 4 stores
    for url in urls:
        check_holds_only_schema(url)


def test_the_schema_only_check_catches_a_row(tmp_path: Path) -> None:
    """The guard run on each template built can fail: a row in a copy is caught."""
    template = SqliteTemplate(tmp_path / "template")
    shutil.copytree(template.root, tmp_path / "copy")
    views = tmp_path / "copy" / SQLITE_DATA / "views.sqlite"
    check_holds_only_schema(f"sqlite:///{views}")
    engine = sa.create_engine(f"sqlite:///{views}")
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO session_activity VALUES ('s', 'k', 1, '2026-01-01')"))
    engine.dispose()
    with pytest.raises(AssertionError, match="holds 1 row"):
        check_holds_only_schema(f"sqlite:///{views}")


# ------------------------------------------------------------ PostgreSQL stores reused


@pytest.fixture
def pg_stores(_pg_stores: PgStores) -> PgStores:
    return _pg_stores


def _fresh_copy_state(stores: PgStores) -> dict[str, object]:
    name = _create_pg_database(template=stores.template)
    try:
        return {**_state(_pg_url(name)), "sequences": _sequences(_pg_url(name))}
    finally:
        _drop_pg_database(name)


def _sequences(url: str) -> list[tuple[object, ...]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return _rows(conn, PG_SEQUENCES)
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_store_given_back_is_handed_out_again_as_a_fresh_copy_under_a_new_name(
    pg_stores: PgStores, tmp_path: Path
) -> None:
    fresh = _fresh_copy_state(pg_stores)
    name = pg_stores.take()
    store = Backend("postgres", _pg_url(name), tmp_path, name)
    kernel = build_kernel(settings_for(store), FakeClock())
    try:
        grant_all(kernel, "alice")
        kernel.capture("alice", interaction("I live in Lisbon and I want to learn the cello"))
        kernel.process()
    finally:
        kernel.close()
    # Not vacuous: the store now holds what the test wrote, and its sequences moved.
    used = {**_state(store.url), "sequences": _sequences(store.url)}
    assert used["rows"] != fresh["rows"] and used["sequences"] != fresh["sequences"]
    left_open = sa.create_engine(store.url)  # a session the test left behind
    left_open.connect()

    reused_before = pg_stores.reused
    pg_stores.give_back(name)
    again = pg_stores.take()
    try:
        assert pg_stores.reused == reused_before + 1
        assert again != name
        assert {**_state(_pg_url(again)), "sequences": _sequences(_pg_url(again))} == fresh
        # The old name reaches nothing, as after a drop: a process an earlier test left
        # behind cannot write into the next test's store.
        with pytest.raises(sa.exc.OperationalError, match="does not exist"):
            sa.create_engine(store.url, poolclass=sa.pool.NullPool).connect()
    finally:
        left_open.dispose()
        pg_stores.give_back(again)


@pytest.mark.postgres
def test_a_store_whose_schema_a_test_changed_is_dropped_not_reused(pg_stores: PgStores) -> None:
    name = pg_stores.take()
    engine = sa.create_engine(_pg_url(name), poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE memories ADD COLUMN left_over text"))
    engine.dispose()
    dropped_before = pg_stores.dropped
    pg_stores.give_back(name)
    assert pg_stores.dropped == dropped_before + 1
    with _admin().connect() as conn:
        left = conn.execute(
            sa.text("SELECT count(*) FROM pg_database WHERE datname LIKE :prefix"),
            {"prefix": f"{name}%"},
        ).scalar_one()
    assert left == 0
    # Handed out next is a store with the template's schema, not the altered one.
    again = pg_stores.take()
    try:
        engine = sa.create_engine(_pg_url(again), poolclass=sa.pool.NullPool)
        with engine.connect() as conn:
            assert pg_schema(conn) == pg_stores.schema
        engine.dispose()
    finally:
        pg_stores.give_back(again)
