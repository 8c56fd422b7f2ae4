"""Shared fixtures: every storage test runs on SQLite and on PostgreSQL.

PostgreSQL is reached through ``UPROF_TEST_POSTGRES_URL`` (default: the local
server on 127.0.0.1:5432 with trust auth). Each test gets its own database with a
random name, dropped at teardown, so tests never share state.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

POSTGRES_ADMIN_URL = os.environ.get(
    "UPROF_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


@dataclass(frozen=True)
class Backend:
    """Where a test's data lives: a SQLAlchemy URL plus, for SQLite, the folder."""

    kind: str  # "sqlite" | "postgres"
    url: str
    data_dir: Path
    pg_dbname: str = ""


def _create_pg_database() -> str:
    name = f"uprof_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    return name


def _drop_pg_database(name: str) -> None:
    admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """A fresh, empty database on each backend."""
    if request.param == "sqlite":
        yield Backend("sqlite", f"sqlite:///{tmp_path / 'uprof.sqlite'}", tmp_path)
        return
    name = _create_pg_database()
    base = sa.engine.make_url(POSTGRES_ADMIN_URL).set(database=name)
    try:
        yield Backend("postgres", base.render_as_string(hide_password=False), tmp_path, name)
    finally:
        _drop_pg_database(name)


@pytest.fixture
def spans() -> Iterator[object]:
    """Tracing on for one test, into the SDK's in-memory exporter (returned)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from uprof import telemetry

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with telemetry.tracing_to(provider):
        yield exporter
    provider.shutdown()
