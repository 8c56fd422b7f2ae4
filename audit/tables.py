"""Tables of the audit log (SQLAlchemy Core), for the log itself and for Alembic.

- ``audit_entries``: one row per leaf, ``leaf_index`` dense from 0. ``entry_json`` holds the
  exact RFC 8785 bytes (as text) that ``leaf_hash`` covers; the other columns are copies of
  entry fields for filtering. ``recorded_at`` is fixed-width UTC RFC 3339 text
  (``2025-01-31T12:00:00.000000Z``), so text comparison is time comparison on every backend.
- ``audit_nodes``: perfect Merkle subtree hashes of level >= 1 (level 0 is
  ``audit_entries.leaf_hash``), written in the same transaction as the leaves that complete
  them. They never change, and make roots and proofs O(log² n) lookups.
- ``audit_checkpoints``: every signed checkpoint note, kept to serve consistency proofs.

All three are append-only. The backend's ``append_only_ddl(APPEND_ONLY_TABLES)``
(``AuditBackend``) returns triggers that make the database refuse UPDATE, DELETE (and TRUNCATE
on PostgreSQL) on them; ``create_tables`` installs them with the tables, and the Alembic
migration that creates these tables ``op.execute``s each statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Protocol

import sqlalchemy as sa

from domain.naming import NAMING_CONVENTION

metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)

#: Fixed-width UTC timestamp text, see module docstring.
_TIMESTAMP = sa.String(32)

audit_entries = sa.Table(
    "audit_entries",
    metadata,
    sa.Column("leaf_index", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("recorded_at", _TIMESTAMP, nullable=False, index=True),
    sa.Column("action", sa.String(100), nullable=False, index=True),
    sa.Column("app_id", sa.String(200), nullable=True, index=True),
    sa.Column("subject_ref", sa.String(200), nullable=True, index=True),
    sa.Column("entry_json", sa.Text, nullable=False),
    sa.Column("leaf_hash", sa.LargeBinary(32), nullable=False),
    sa.CheckConstraint("leaf_index >= 0", name="leaf_index_non_negative"),
)

audit_nodes = sa.Table(
    "audit_nodes",
    metadata,
    sa.Column("level", sa.SmallInteger, primary_key=True, autoincrement=False),
    sa.Column("node_index", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("hash", sa.LargeBinary(32), nullable=False),
    sa.CheckConstraint("level >= 1", name="level_positive"),
)

audit_checkpoints = sa.Table(
    "audit_checkpoints",
    metadata,
    sa.Column("tree_size", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("root", sa.LargeBinary(32), nullable=False),
    sa.Column("note", sa.Text, nullable=False),
    sa.Column("created_at", _TIMESTAMP, nullable=False),
)

APPEND_ONLY_TABLES = ("audit_entries", "audit_nodes", "audit_checkpoints")


class AuditBackend(Protocol):
    """What the audit log needs that databases do their own way.

    uprof's storage backends (``uprof.backends``) implement it; this package names no
    database, so a new backend is added there, not here.
    """

    def append_only_ddl(self, tables: Sequence[str]) -> list[str]:
        """Statements that make the database refuse UPDATE and DELETE (and TRUNCATE, where
        it has one) on ``tables``; idempotent, free of ``%`` and ``:name`` so they run
        unchanged through ``exec_driver_sql`` and Alembic's ``op.execute``."""
        ...

    def serialised_transaction(
        self, engine: sa.Engine, lock_key: int
    ) -> AbstractContextManager[sa.Connection]:
        """A write transaction that writers holding the same ``lock_key`` enter one at a
        time, and in which reads after entering see every earlier writer's commit."""
        ...

    def flushed_transaction(self, engine: sa.Engine) -> AbstractContextManager[sa.Connection]:
        """A write transaction whose commit reaches the disk before it returns, with every
        commit before it, whatever the engine's own setting."""
        ...

    def is_transient_lock(self, error: BaseException | None) -> bool:
        """Whether a driver error says another writer holds a lock for now (worth another
        attempt), judged by the driver's error code, never its wording."""
        ...

    def text_position(self, column: sa.ColumnElement[str], needle: str) -> sa.ColumnElement[int]:
        """Where ``needle`` starts in ``column``'s text, 1-based, 0 when absent: an exact,
        case-sensitive substring test without wildcards (which LIKE is not on SQLite)."""
        ...


def create_tables(engine: sa.Engine, backend: AuditBackend) -> None:
    """Create the audit tables with their append-only triggers (tests, benchmarks: a
    deployment runs the Alembic migration, which installs the same triggers)."""
    with engine.begin() as conn:
        metadata.create_all(conn)
        for statement in backend.append_only_ddl(APPEND_ONLY_TABLES):
            conn.exec_driver_sql(statement)
