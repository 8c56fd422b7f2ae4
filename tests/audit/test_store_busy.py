"""The audit log retries a write only when the driver reports a transient lock.

Classified by the driver's error code (SQLite result code, PostgreSQL SQLSTATE), never by
the message's wording, which varies across versions and locales.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.log import AuditLog
from audit.tables import create_tables
from domain.errors import StoreBusyError
from tests.conftest import Backend
from uprof.backends import backend_for, backend_named
from uprof.retry import RetryPolicy


def _store_busy(error: sa.exc.OperationalError, scheme: str) -> bool:
    """What the audit log asks its database's backend about a failed write."""
    return backend_named(scheme).is_transient_lock(error.orig)


def _operational_error(engine: sa.Engine, statement: str) -> sa.exc.OperationalError:
    with pytest.raises(sa.exc.OperationalError) as caught, engine.begin() as conn:
        conn.execute(sa.text(statement))
    return caught.value


def test_a_sqlite_lock_is_busy_and_a_missing_table_is_not(tmp_path: Path) -> None:
    path = tmp_path / "busy.sqlite"
    holder = sqlite3.connect(path, timeout=0)
    holder.execute("CREATE TABLE t (x INTEGER)")
    holder.commit()
    engine = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
    try:
        assert not _store_busy(_operational_error(engine, "SELECT * FROM no_such_table"), "sqlite")
        holder.execute("BEGIN EXCLUSIVE")
        assert _store_busy(_operational_error(engine, "INSERT INTO t VALUES (1)"), "sqlite")
    finally:
        holder.rollback()
        holder.close()
        engine.dispose()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_postgres_lock_timeout_is_busy_and_a_syntax_error_is_not(backend: Backend) -> None:
    engine = sa.create_engine(backend.url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE t (x INTEGER)"))
        with engine.connect() as holder:
            holder.execute(sa.text("LOCK TABLE t IN ACCESS EXCLUSIVE MODE"))
            waiter = sa.create_engine(backend.url, connect_args={"options": "-c lock_timeout=100"})
            try:
                assert _store_busy(
                    _operational_error(waiter, "INSERT INTO t VALUES (1)"), "postgresql"
                )
            finally:
                waiter.dispose()
            holder.rollback()
        # A statement the server refuses for good is a ProgrammingError, never retried;
        # an OperationalError without a lock state is not busy either.
        with pytest.raises(sa.exc.ProgrammingError), engine.begin() as conn:
            conn.execute(sa.text("SELEC 1"))
        unreachable = sa.create_engine(
            "postgresql+psycopg://postgres@127.0.0.1:1/none", connect_args={"connect_timeout": 1}
        )
        try:
            with pytest.raises(sa.exc.OperationalError) as caught:
                unreachable.connect()
            assert not _store_busy(caught.value, "postgresql")
        finally:
            unreachable.dispose()
    finally:
        engine.dispose()


def test_a_locked_log_raises_store_busy_and_the_retry_policy_waits_it_out(
    tmp_path: Path,
) -> None:
    """The driver's lock error reaches the retry policy as the typed StoreBusyError."""
    path = tmp_path / "locked.sqlite"
    engine = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
    create_tables(engine, backend_for(engine))
    key = Ed25519PrivateKey.generate()
    holder = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        once = AuditLog(
            engine,
            key,
            "uprof.test/busy",
            backend=backend_for(engine),
            retry=lambda operation: operation(),
        )
        with pytest.raises(StoreBusyError) as busy:
            once.append({"action": "while-locked"})
        assert isinstance(busy.value.__cause__, sa.exc.OperationalError)

        seen: list[type[BaseException]] = []

        def release_after_two(error: BaseException) -> None:
            seen.append(type(error))
            if len(seen) == 2:
                holder.execute("ROLLBACK")

        policy = RetryPolicy(attempts=5, on=(StoreBusyError,))
        log = AuditLog(
            engine,
            key,
            "uprof.test/busy",
            backend=backend_for(engine),
            retry=lambda operation: policy.call(operation, before_retry=release_after_two),
        )
        record = log.append({"action": "after-the-lock"})
        assert seen == [StoreBusyError, StoreBusyError]
        assert record.leaf_index == 0 and log.size() == 1  # the refused append left nothing
    finally:
        holder.close()
        engine.dispose()
