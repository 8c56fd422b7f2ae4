"""Storage backends are chosen by URL scheme, and callers ask them instead of the dialect.

``uprof.backends`` is the one place where SQLite and PostgreSQL differ (issue 17).
These checks hold the registry to the settings' validation and to the test fixture:
a backend the registry knows is one the ``backend`` fixture runs every storage test on.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.conftest import Backend as FixtureBackend
from uprof.backends import REGISTRY, backend_for, backend_for_url, backend_named, scheme_of
from uprof.settings import Settings
from uprof.storage import create_engine

ROOT = Path(__file__).resolve().parents[2]


def test_the_scheme_picks_the_backend_whatever_the_driver() -> None:
    assert scheme_of("postgresql+psycopg://u@h/db") == "postgresql"
    assert backend_for_url("postgresql+psycopg://u@h/db").name == "postgres"
    assert backend_for_url("postgresql://u@h/db").name == "postgres"
    assert backend_for_url("sqlite:///x.sqlite").name == "sqlite"


def test_an_engine_reports_its_backend(backend: FixtureBackend) -> None:
    engine = create_engine(backend.url)
    try:
        assert backend_for(engine).name == backend.kind
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://u@h/db", "no storage backend for 'mysql'"),
        ("not a url", "is not a database URL"),
        ("sqlite:///elsewhere.sqlite", "leave it unset for the embedded SQLite default"),
        ("postgresql+psycopg2://u@h/db", "must be a PostgreSQL URL"),
    ],
)
def test_a_database_url_no_backend_takes_is_refused_naming_the_field(
    url: str, says: str, tmp_path: Path
) -> None:
    with pytest.raises(ValidationError, match="database_url") as raised:
        Settings(data_dir=tmp_path / "d", database_url=url)
    assert says in str(raised.value)


def test_every_registered_backend_runs_the_storage_tests() -> None:
    """Adding a backend means its module, its registry entry and the fixture's parameter."""
    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text("utf-8"))
    (fixture,) = [
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "backend"
    ]
    params = {
        n.value
        for n in ast.walk(fixture.decorator_list[0])
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }
    for scheme in REGISTRY:
        assert backend_named(scheme).name in params, scheme


def test_no_product_code_outside_the_backends_asks_for_a_dialect_name() -> None:
    """Callers ask the backend object; only the registry maps a dialect name to it."""
    allowed = {ROOT / "uprof" / "backends" / "__init__.py"}
    offenders = []
    for package in ("uprof", "audit", "migrations", "domain", "projections", "policies"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path in allowed:
                continue
            for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
                if "dialect.name" in line or "dialect_name" in line:
                    offenders.append(f"{path.relative_to(ROOT)}:{number}")
    assert offenders == []
