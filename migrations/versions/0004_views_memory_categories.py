"""memories carry every category they reveal

Revision ID: 0004_views_memory_categories
Revises: 0003_views_idem_sealed
Create Date: 2026-12-01

Rows projected before this revision get ``["*"]``: "every category", so a read serves
them only to an app allowed every category, until ``uprof projections rebuild`` derives their
real categories from the log (decision 0016). Failing closed is the point: the old
rows' categories cannot be computed here (the texts are sealed).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_views_memory_categories"
down_revision = "0003_views_idem_sealed"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("memories", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("categories", sa.Text(), nullable=False, server_default='["*"]')
        )
    with op.batch_alter_table("memories", schema=None) as batch_op:
        batch_op.alter_column("categories", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("memories", schema=None) as batch_op:
        batch_op.drop_column("categories")
