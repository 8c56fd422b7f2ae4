"""rate-limit counters, for every server of a deployment (uprof.services.rate_limits)

Revision ID: 0008_views_rate_limit_slots
Revises: 0007_views_signed_out_sessions
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_views_rate_limit_slots"
down_revision = "0007_views_signed_out_sessions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rate_limit_slots",
        sa.Column("bucket", sa.String(64), nullable=False),
        sa.Column("period_s", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("slot", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("hits", sa.Integer(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("bucket", "period_s", "slot", name=op.f("pk_rate_limit_slots")),
    )
    op.create_index(
        op.f("ix_rate_limit_slots_expires_at"), "rate_limit_slots", ["expires_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_rate_limit_slots_expires_at"), table_name="rate_limit_slots")
    op.drop_table("rate_limit_slots")
