"""the data stores' record of the keys erasures destroyed (uprof.services.erased_keys)

Revision ID: 0006_views_erased_keys
Revises: 0005_views_consent_positions
Create Date: 2026-12-04

The erasure ledger's destructive records, mirrored in the data stores: a key folder put
back from a copy older than an erasure no longer undoes it. Created empty; the first
start after the upgrade copies the ledger's records into it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_views_erased_keys"
down_revision = "0005_views_consent_positions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "erased_keys",
        sa.Column("stream_id", sa.String(36), nullable=False),
        sa.Column("capture_id", sa.String(32), nullable=False),
        sa.Column("erased_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("mark", sa.String(64), nullable=True),
        sa.PrimaryKeyConstraint("stream_id", "capture_id", name=op.f("pk_erased_keys")),
    )


def downgrade() -> None:
    op.drop_table("erased_keys")
