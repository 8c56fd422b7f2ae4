"""who destroyed each subject data key and capture key (decision
0141-exact-erasure-attribution)

Revision ID: 0006_keys_destroyed_keys
Revises: 0005_keys_plain_row_keys
Create Date: 2026-12-05

Additive: a new table, no row rewritten. Keys destroyed before this revision have no
row; an erasure that finds none cites the ledger record as before (GL's fallback). A
process still running the older code beside one that migrated writes no row either,
with the same fallback; it never fails on the table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_keys_destroyed_keys"
down_revision = "0005_keys_plain_row_keys"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "destroyed_keys",
        sa.Column("stream_id", sa.String(length=36), nullable=False),
        sa.Column("key_version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("dek_commitment", sa.String(length=64), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=True),
        sa.Column("destroyed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("stream_id", "key_version", name=op.f("pk_destroyed_keys")),
    )
    op.create_table(
        "destroyed_capture_keys",
        sa.Column("capture_id", sa.String(length=32), nullable=False),
        sa.Column("stream_id", sa.String(length=36), nullable=False),
        sa.Column("key_commitment", sa.String(length=64), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=True),
        sa.Column("destroyed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("capture_id", name=op.f("pk_destroyed_capture_keys")),
    )


def downgrade() -> None:
    op.drop_table("destroyed_capture_keys")
    op.drop_table("destroyed_keys")
