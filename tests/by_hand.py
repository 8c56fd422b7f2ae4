"""Statements run by hand on a store, as an operator's SQL shell would: the attacks and
damages the tests make to a deployment's tables from outside uprof."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

import sqlalchemy as sa

if TYPE_CHECKING:
    from tests.conftest import Backend
    from uprof.settings import Settings


def by_hand(backend: Backend, settings: Settings, sqlite_file: str, *statements: str) -> None:
    """Run ``statements`` in one transaction: on SQLite in the data folder's
    ``sqlite_file`` (through the driver, never open(): FIELD-NOTES 8.1, waiting up to
    30 s for a writer of the deployment's), on PostgreSQL in the backend's database."""
    if backend.kind == "sqlite":
        conn = sqlite3.connect(settings.data_dir / sqlite_file, timeout=30)
        try:
            for statement in statements:
                conn.execute(statement)
            conn.commit()
        finally:
            conn.close()
        return
    engine = sa.create_engine(backend.url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(sa.text(statement))
    finally:
        engine.dispose()
