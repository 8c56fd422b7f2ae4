"""keys that authenticate plaintext event rows

Revision ID: 0005_keys_plain_row_keys
Revises: 0004_keys_stream_heads
Create Date: 2026-12-05

The rows themselves are re-written with tags by the start after this revision
(``uprof.crypto.plain_rows``), which needs the KEK and the event log: not a migration's
work; it records that it finished in the key folder (``KeyMaterialStore``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_keys_plain_row_keys"
down_revision = "0004_keys_stream_heads"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "plain_row_keys",
        sa.Column("key_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("wrapped_key", sa.LargeBinary(), nullable=False),
        sa.Column("kek_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key_id", name=op.f("pk_plain_row_keys")),
    )


def downgrade() -> None:
    op.drop_table("plain_row_keys")
