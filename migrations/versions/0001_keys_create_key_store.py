"""create key store tables

Revision ID: 0001_keys
Revises: (none)
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_keys"
down_revision = None
branch_labels = ("keys",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "subject_index",
        sa.Column("ref_hash", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("stream_id", sa.String(length=36), nullable=False),
        sa.Column("pseudonym", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("ref_hash", name=op.f("pk_subject_index")),
        sa.UniqueConstraint("stream_id", name=op.f("uq_subject_index_stream_id")),
    )
    op.create_table(
        "subject_aliases",
        sa.Column("alias_hash", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("stream_id", sa.String(length=36), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("alias_hash", name=op.f("pk_subject_aliases")),
    )
    op.create_index(
        op.f("ix_subject_aliases_stream_id"), "subject_aliases", ["stream_id"], unique=False
    )
    op.create_table(
        "subject_keys",
        sa.Column("stream_id", sa.String(length=36), nullable=False),
        sa.Column("key_version", sa.Integer(), nullable=False),
        sa.Column("wrapped_dek", sa.LargeBinary(), nullable=False),
        sa.Column("kek_id", sa.String(length=64), nullable=False),
        sa.Column("dek_commitment", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("stream_id", "key_version", name=op.f("pk_subject_keys")),
    )
    op.create_table(
        "capture_keys",
        sa.Column("capture_id", sa.String(length=32), nullable=False),
        sa.Column("stream_id", sa.String(length=36), nullable=False),
        sa.Column("wrapped_key", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("capture_id", name=op.f("pk_capture_keys")),
    )
    op.create_index(op.f("ix_capture_keys_stream_id"), "capture_keys", ["stream_id"], unique=False)
    op.create_table(
        "shredded_streams",
        sa.Column("stream_id", sa.String(length=36), nullable=False),
        sa.Column("shredded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("stream_id", name=op.f("pk_shredded_streams")),
    )


def downgrade() -> None:
    op.drop_table("shredded_streams")
    op.drop_index(op.f("ix_capture_keys_stream_id"), table_name="capture_keys")
    op.drop_table("capture_keys")
    op.drop_table("subject_keys")
    op.drop_index(op.f("ix_subject_aliases_stream_id"), table_name="subject_aliases")
    op.drop_table("subject_aliases")
    op.drop_table("subject_index")
