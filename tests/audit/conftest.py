"""Fixtures for the audit tests: a signing key, a fixed clock and a log on each backend."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.log import AuditLog, SigningKeys
from audit.tables import create_tables
from tests.conftest import Backend
from uprof.backends import backend_for
from uprof.retry import AUDIT_APPEND

ORIGIN = "uprof.test/audit"


def make_clock(start: datetime | None = None) -> Callable[[], datetime]:
    """A clock that advances one second per reading (deterministic, thread-safe enough)."""
    base = start or datetime(2025, 1, 1, tzinfo=UTC)
    ticks = itertools.count()
    return lambda: base + timedelta(seconds=next(ticks))


def audit_log_on(
    engine: sa.Engine, keys: Ed25519PrivateKey | SigningKeys, origin: str = ORIGIN
) -> AuditLog:
    """A log on ``engine`` as the tests open one: retried appends, the one-second clock."""
    return AuditLog(
        engine,
        keys,
        origin,
        backend=backend_for(engine),
        retry=AUDIT_APPEND.call,
        clock=make_clock(),
    )


@pytest.fixture
def signing_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def engine(backend: Backend) -> Iterator[sa.Engine]:
    eng = sa.create_engine(backend.url)
    create_tables(eng, backend_for(eng))
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture
def log(engine: sa.Engine, signing_key: Ed25519PrivateKey) -> AuditLog:
    return audit_log_on(engine, signing_key)


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[sa.Engine]:
    eng = sa.create_engine(f"sqlite:///{tmp_path / 'audit.sqlite'}")
    create_tables(eng, backend_for(eng))
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture
def sqlite_log(sqlite_engine: sa.Engine, signing_key: Ed25519PrivateKey) -> AuditLog:
    return audit_log_on(sqlite_engine, signing_key)


def sample_entry(i: int) -> dict[str, object]:
    """A varied, allowlisted entry."""
    actions = ("AccessDecision", "consent.granted", "consent.withdrawn", "KeyCreated")
    return {
        "action": actions[i % len(actions)],
        "app_id": f"app-{i % 3}",
        "subject_ref": f"sub_{i % 7:04d}",
        "purpose": "personalization",
        "categories": ["diet", "preference"][: 1 + i % 2],
        "counts": {"items": i % 11},
        "decision": "allow" if i % 5 else "deny",
    }
