"""create the api key table

Revision ID: 0002_keys_api_keys
Revises: 0001_keys
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_keys_api_keys"
down_revision = "0001_keys"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.String(length=32), nullable=False),
        sa.Column("app_id", sa.String(length=128), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("roles", sa.String(length=256), server_default="app", nullable=False),
        sa.PrimaryKeyConstraint("key_id", name=op.f("pk_api_keys")),
    )
    op.create_index(op.f("ix_api_keys_app_id"), "api_keys", ["app_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_api_keys_app_id"), table_name="api_keys")
    op.drop_table("api_keys")
