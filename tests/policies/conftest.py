"""Fixtures for the authorization tests: the packaged seed, in memory or as a file copy."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import sqlalchemy as sa

from policies import CasbinAuthorizer, copy_seed_policy

if TYPE_CHECKING:
    from tests.conftest import Backend
    from uprof.settings import Settings


@pytest.fixture
def seeded() -> CasbinAuthorizer:
    """The packaged model and seed policy, changes kept in memory."""
    return CasbinAuthorizer.seeded()


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    """A writable copy of the seed policy."""
    path = tmp_path / "policy.csv"
    assert copy_seed_policy(path)
    return path


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    """A copy of the packaged model, so tests can edit it."""
    from policies import packaged_model_text

    path = tmp_path / "model.conf"
    path.write_text(packaged_model_text(), encoding="utf-8")
    return path


def on_the_policy_table(backend: Backend, settings: Settings, *statements: str) -> None:
    """Run ``statements`` by hand on the policy store's event table, ``{table}`` naming it:
    ``stored_events`` in SQLite's ``policies.sqlite`` (through the driver, never open():
    FIELD-NOTES 8.1), ``policies_events`` on PostgreSQL. One transaction."""
    if backend.kind == "sqlite":
        conn = sqlite3.connect(settings.data_dir / "policies.sqlite")
        try:
            for statement in statements:
                conn.execute(statement.format(table="stored_events"))
            conn.commit()
        finally:
            conn.close()
        return
    engine = sa.create_engine(backend.url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(sa.text(statement.format(table="policies_events")))
    finally:
        engine.dispose()
