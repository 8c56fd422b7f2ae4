"""web sessions signed out, for every server (uprof.services.sign_outs)

Revision ID: 0007_views_signed_out_sessions
Revises: 0006_views_erased_keys
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_views_signed_out_sessions"
down_revision = "0006_views_erased_keys"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "signed_out_sessions",
        sa.Column("session_id", sa.String(64), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("session_id", name=op.f("pk_signed_out_sessions")),
    )
    op.create_index(
        op.f("ix_signed_out_sessions_expires_at"),
        "signed_out_sessions",
        ["expires_at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_signed_out_sessions_expires_at"), table_name="signed_out_sessions")
    op.drop_table("signed_out_sessions")
