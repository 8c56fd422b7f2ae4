"""Tables of the audit log (SQLAlchemy Core), for the log itself and for Alembic.

- ``audit_entries``: one row per leaf, ``leaf_index`` dense from 0. ``entry_json`` holds the
  exact RFC 8785 bytes (as text) that ``leaf_hash`` covers; the other columns are copies of
  entry fields for filtering. ``recorded_at`` is fixed-width UTC RFC 3339 text
  (``2025-01-31T12:00:00.000000Z``), so text comparison is time comparison on every backend.
- ``audit_nodes``: perfect Merkle subtree hashes of level >= 1 (level 0 is
  ``audit_entries.leaf_hash``), written in the same transaction as the leaves that complete
  them. They never change, and make roots and proofs O(log² n) lookups.
- ``audit_checkpoints``: every signed checkpoint note, kept to serve consistency proofs.

All three are append-only. ``append_only_ddl(dialect)`` returns triggers that make the database
refuse UPDATE, DELETE (and TRUNCATE on PostgreSQL) on them; ``metadata.create_all`` installs
them, and the Alembic migration that creates these tables must ``op.execute`` each statement.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy import event

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


def append_only_ddl(dialect_name: str) -> list[str]:
    """Return the statements that make the audit tables refuse UPDATE and DELETE.

    Supported dialects: ``sqlite`` and ``postgresql`` (14 or later, for CREATE OR REPLACE
    TRIGGER); others get an empty list. The statements hold no ``%`` or ``:name``, so they run
    unchanged through ``exec_driver_sql`` and Alembic's ``op.execute``.
    """
    if dialect_name == "sqlite":
        return [
            f"CREATE TRIGGER IF NOT EXISTS trg_{table}_no_{op.lower()} BEFORE {op} ON {table} "
            f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
            for table in APPEND_ONLY_TABLES
            for op in ("UPDATE", "DELETE")
        ]
    if dialect_name == "postgresql":
        statements = [
            "CREATE OR REPLACE FUNCTION uprof_audit_append_only() RETURNS trigger "
            "LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION USING MESSAGE = TG_TABLE_NAME "
            "|| ' is append-only (' || TG_OP || ' refused)'; END $$"
        ]
        for table in APPEND_ONLY_TABLES:
            statements += [
                f"CREATE OR REPLACE TRIGGER trg_{table}_no_update_delete BEFORE UPDATE OR DELETE "
                f"ON {table} FOR EACH ROW EXECUTE FUNCTION uprof_audit_append_only()",
                f"CREATE OR REPLACE TRIGGER trg_{table}_no_truncate BEFORE TRUNCATE "
                f"ON {table} FOR EACH STATEMENT EXECUTE FUNCTION uprof_audit_append_only()",
            ]
        return statements
    return []


def _install_append_only_triggers(
    target: sa.MetaData, connection: sa.Connection, **_: object
) -> None:
    for statement in append_only_ddl(connection.dialect.name):
        connection.exec_driver_sql(statement)


event.listen(metadata, "after_create", _install_append_only_triggers)
