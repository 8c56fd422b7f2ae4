"""Fixtures for the authorization tests: the packaged seed, in memory or as a file copy."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from policies import CasbinAuthorizer, copy_seed_policy
from tests.by_hand import by_hand

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
    ``stored_events`` in SQLite's ``policies.sqlite``, ``policies_events`` on PostgreSQL.
    One transaction."""
    table = "stored_events" if backend.kind == "sqlite" else "policies_events"
    by_hand(backend, settings, "policies.sqlite", *(s.format(table=table) for s in statements))
