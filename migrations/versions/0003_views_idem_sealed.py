"""idempotency keys; session ids and source refs no longer in plaintext in the views

Revision ID: 0003_views_idem_sealed
Revises: 0002_audit
Create Date: 2026-12-01

- ``idempotency_keys``: claims and first answers of keyed writes (I14).
- ``captures.session_id`` and ``memories.session_id`` become ciphertext (sealed under
  the subject's view key);
  ``captures.session_key``, ``memories.session_key`` and ``session_activity.session_key``
  hold a keyed hash instead of the session id; ``captures.source_ref_key`` a keyed
  hash of (app, source ref) for imports to match.

Existing rows cannot be converted here (the keys live in the key store, not in
this database), and every row of these tables is derived from the event log. So the
profile read model is emptied and its position reset: the first ``process()`` after
the upgrade (or ``uprof projections rebuild``) rebuilds it from the log. The old rows'
plaintext may linger in dead tuples and WAL until ``VACUUM FULL`` and checkpoints
(docs/governance.md, "What remains after erasure").
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_views_idem_sealed"
down_revision = "0002_audit"
branch_labels = None
depends_on = None
#: Its downgrade is refused (the old columns held plaintext): ``uprof restore`` reads this
#: to refuse, before anything changes, a backup of a revision below it (bug LE).
one_way = True

#: Rows of the profile read model, purged so that it is rebuilt from the log.
_DERIVED = (
    "item_reads",
    "consents",
    "intents",
    "attributes",
    "profile_subjects",
)
TZ = sa.DateTime(timezone=True)


def _captures() -> None:
    op.create_table(
        "captures",
        sa.Column("capture_id", sa.String(length=32), nullable=False),
        sa.Column("stream_id", sa.String(length=36), nullable=False),
        sa.Column("notification_id", sa.BigInteger(), nullable=False),
        sa.Column("app_id", sa.String(length=128), nullable=False),
        sa.Column("agent_id", sa.String(length=128), nullable=False),
        sa.Column("agent_type", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.LargeBinary(), nullable=False),
        sa.Column("session_key", sa.String(length=32), nullable=False),
        sa.Column("actor", sa.LargeBinary(), nullable=False),
        sa.Column("purpose", sa.String(length=64), nullable=False),
        sa.Column("sharing", sa.String(length=256), nullable=False),
        sa.Column("source_ref", sa.LargeBinary(), nullable=False),
        sa.Column("source_ref_key", sa.String(length=32), nullable=False),
        sa.Column("user_input", sa.LargeBinary(), nullable=False),
        sa.Column("agent_response", sa.LargeBinary(), nullable=False),
        sa.Column("occurred_at", TZ, nullable=False),
        sa.Column("recorded_at", TZ, nullable=False),
        sa.PrimaryKeyConstraint("capture_id", name=op.f("pk_captures")),
    )
    op.create_index(op.f("ix_captures_stream_id"), "captures", ["stream_id"], unique=False)
    op.create_index(
        op.f("ix_captures_source_ref_key"), "captures", ["source_ref_key"], unique=False
    )


def _memories() -> None:
    op.create_table(
        "memories",
        sa.Column("item_id", sa.String(length=32), nullable=False),
        sa.Column("stream_id", sa.String(length=36), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("text", sa.LargeBinary(), nullable=False),
        sa.Column("category", sa.String(length=32), nullable=False),
        sa.Column("importance", sa.Float(), nullable=False),
        sa.Column("provenance", sa.String(length=16), nullable=False),
        sa.Column("evidence", sa.Text(), nullable=False),
        sa.Column("source_refs", sa.LargeBinary(), nullable=False),
        sa.Column("owner_agent", sa.String(length=128), nullable=False),
        sa.Column("sharing", sa.String(length=256), nullable=False),
        sa.Column("author", sa.String(length=64), nullable=False),
        sa.Column("actor", sa.LargeBinary(), nullable=False),
        sa.Column("session_id", sa.LargeBinary(), nullable=False),
        sa.Column("session_key", sa.String(length=32), nullable=False),
        sa.Column("occurred_at", TZ, nullable=False),
        sa.Column("recorded_at", TZ, nullable=False),
        sa.Column("visits", sa.Integer(), nullable=False),
        sa.Column("last_visited_at", TZ, nullable=True),
        sa.Column("archived", sa.Boolean(), nullable=False),
        sa.Column("embedding", sa.LargeBinary(), nullable=True),
        sa.Column("detail", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("item_id", name=op.f("pk_memories")),
    )
    op.create_index(op.f("ix_memories_stream_id"), "memories", ["stream_id"], unique=False)


def _session_activity() -> None:
    op.create_table(
        "session_activity",
        sa.Column("stream_id", sa.String(length=36), nullable=False),
        sa.Column("session_key", sa.String(length=32), nullable=False),
        sa.Column("captures", sa.Integer(), nullable=False),
        sa.Column("last_at", TZ, nullable=False),
        sa.PrimaryKeyConstraint("stream_id", "session_key", name=op.f("pk_session_activity")),
    )


def upgrade() -> None:
    op.create_table(
        "idempotency_keys",
        sa.Column("token", sa.String(length=64), nullable=False),
        sa.Column("app_id", sa.String(length=128), nullable=False),
        sa.Column("operation", sa.String(length=32), nullable=False),
        sa.Column("body_hash", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=8), nullable=False),
        sa.Column("status", sa.Integer(), nullable=True),
        sa.Column("response", sa.Text(), nullable=True),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.Column("expires_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("token", name=op.f("pk_idempotency_keys")),
    )
    op.create_index(
        op.f("ix_idempotency_keys_expires_ms"), "idempotency_keys", ["expires_ms"], unique=False
    )
    for table in ("session_activity", "memories", "captures"):
        op.drop_table(table)  # their indexes go with them
    for table in _DERIVED:
        op.execute(sa.text(f"DELETE FROM {table}"))
    op.execute(sa.text("DELETE FROM projection_tracking WHERE projection_name = 'profile'"))
    _captures()
    _memories()
    _session_activity()


def downgrade() -> None:
    raise NotImplementedError("0003_views_idem_sealed is one-way: the old columns held plaintext")
