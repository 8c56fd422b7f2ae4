"""consents carry the log positions of their grant and withdrawal

Revision ID: 0005_views_consent_positions
Revises: 0004_views_memory_categories
Create Date: 2026-12-04

A withdrawal with erase collects the app's captures made under the consent: after the
grant's log position and before the withdrawal's, the same clock as the captures'
``notification_id`` (decision 0055). Rows projected before this revision have NULL
positions: their positions cannot be computed here (the events are in the log, sealed),
so a withdrawal of such a consent falls back to the times (``granted_at`` <=
``recorded_at`` <= ``withdrawn_at``) until ``uprof projections rebuild`` fills them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_views_consent_positions"
down_revision = "0004_views_memory_categories"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("consents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("granted_position", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("withdrawn_position", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("consents", schema=None) as batch_op:
        batch_op.drop_column("withdrawn_position")
        batch_op.drop_column("granted_position")
