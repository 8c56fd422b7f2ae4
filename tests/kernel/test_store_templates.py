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

from tests.conftest import (
    Backend,
    store_from_template,
)
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for
from tests.templates import SQLITE_DATA, SqliteTemplate, check_holds_only_schema

#: What the schema is made of, as each backend's catalog states it.
PG_SCHEMA = {
    "columns": "SELECT table_name, column_name, data_type, is_nullable, column_default "
    "FROM information_schema.columns WHERE table_schema = 'public'",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'",
    "constraints": "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) "
    "FROM pg_constraint WHERE connamespace = 'public'::regnamespace",
    "triggers": "SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) "
    "FROM pg_trigger WHERE NOT tgisinternal",
    "functions": "SELECT proname, prosrc FROM pg_proc WHERE pronamespace = 'public'::regnamespace",
}


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
