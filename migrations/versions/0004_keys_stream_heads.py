"""stream-head anchors in the key store

Revision ID: 0004_keys_stream_heads
Revises: 0003_keys_api_key_tenant
Create Date: 2026-12-05

Empty at first: a stream without an anchor is unknown, and its first load adopts the
head it finds (decision 0132-stream-head-anchor).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_keys_stream_heads"
down_revision = "0003_keys_api_key_tenant"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "stream_heads",
        sa.Column("log_id", sa.String(length=32), nullable=False),
        sa.Column("stream_id", sa.String(length=36), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("log_id", "stream_id", name=op.f("pk_stream_heads")),
    )


def downgrade() -> None:
    op.drop_table("stream_heads")
