"""api keys name the tenant they were issued in

Revision ID: 0003_keys_api_key_tenant
Revises: 0002_keys_api_keys
Create Date: 2026-12-05

Keys issued before have none (NULL): they keep working in any tenant of the stores, as
they did, until they are replaced (docs/security.md).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_keys_api_key_tenant"
down_revision = "0002_keys_api_keys"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("tenant", sa.String(length=128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("tenant")
