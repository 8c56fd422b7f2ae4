"""Tables of the profile read model (owned by alembic, branch ``views``).

Every row carries the subject's random ``stream_id``; nothing here names a person.
Identifiers a caller sends (session ids, source refs) are never stored in plaintext,
in a column or an index: they are ``SEALED`` where they are shown back, and kept as
a keyed hash under the subject's view key (``*_key`` columns, ViewSealer.lookup)
where they are matched.
Columns holding what a person said or what was learnt about them are ``SEALED``:
AES-SIV ciphertext under a key derived from the subject's data key, bound to
table, column and row. A backup of these tables taken before an erasure is
therefore unreadable once the erasure destroyed the key (I9). List-valued
columns hold JSON so the same schema works on SQLite and PostgreSQL.
"""

from __future__ import annotations

import sqlalchemy as sa

from domain.naming import NAMING_CONVENTION

metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)

TZ = sa.DateTime(timezone=True)
#: Ciphertext of personal content (see module docstring).
SEALED = sa.LargeBinary

#: Position of each projection in each application's notification log.
projection_tracking = sa.Table(
    "projection_tracking",
    metadata,
    sa.Column("projection_name", sa.String(64), primary_key=True),
    sa.Column("application_name", sa.String(64), primary_key=True),
    sa.Column("notification_id", sa.BigInteger, nullable=False),
)

subjects = sa.Table(
    "profile_subjects",
    metadata,
    sa.Column("stream_id", sa.String(36), primary_key=True),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("capture_count", sa.Integer, nullable=False, default=0),
    sa.Column("last_notification_id", sa.BigInteger, nullable=False, default=0),
    sa.Column("last_capture_notification_id", sa.BigInteger, nullable=False, default=0),
    #: Moves only when the subject's memories change (not on reads): a cache key.
    sa.Column("memory_notification_id", sa.BigInteger, nullable=False, default=0),
    sa.Column("registered_at", TZ, nullable=False),
)

captures = sa.Table(
    "captures",
    metadata,
    sa.Column("capture_id", sa.String(32), primary_key=True),
    sa.Column("stream_id", sa.String(36), nullable=False, index=True),
    sa.Column("notification_id", sa.BigInteger, nullable=False),
    sa.Column("app_id", sa.String(128), nullable=False),
    sa.Column("agent_id", sa.String(128), nullable=False),
    sa.Column("agent_type", sa.String(64), nullable=False),
    sa.Column("session_id", SEALED, nullable=False),
    #: Keyed hash of the session id (see the module docstring), for counting captures per session.
    sa.Column("session_key", sa.String(32), nullable=False),
    sa.Column("actor", SEALED, nullable=False),
    sa.Column("purpose", sa.String(64), nullable=False),
    sa.Column("sharing", sa.String(256), nullable=False),
    sa.Column("source_ref", SEALED, nullable=False),
    #: Keyed hash of (app, source ref), so an import can skip what was captured.
    sa.Column("source_ref_key", sa.String(32), nullable=False, index=True),
    sa.Column("user_input", SEALED, nullable=False),
    sa.Column("agent_response", SEALED, nullable=False),
    sa.Column("occurred_at", TZ, nullable=False),
    sa.Column("recorded_at", TZ, nullable=False),
)

attributes = sa.Table(
    "attributes",
    metadata,
    sa.Column("item_id", sa.String(32), primary_key=True),
    sa.Column("stream_id", sa.String(36), nullable=False, index=True),
    sa.Column("key", sa.String(64), nullable=False),
    sa.Column("category", sa.String(32), nullable=False),
    sa.Column("value", SEALED, nullable=False),
    sa.Column("confidence", sa.Float, nullable=False),
    sa.Column("provenance", sa.String(16), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("conflicts_with", sa.Text, nullable=False, default="[]"),
    sa.Column("superseded_by", sa.String(32), nullable=False, default=""),
    sa.Column("owner_agent", sa.String(128), nullable=False),
    sa.Column("sharing", sa.String(256), nullable=False),
    sa.Column("author", sa.String(64), nullable=False),
    sa.Column("evidence", sa.Text, nullable=False),
    sa.Column("first_observed_at", TZ, nullable=False),
    sa.Column("last_observed_at", TZ, nullable=False),
    sa.Column("recorded_at", TZ, nullable=False),
)

memories = sa.Table(
    "memories",
    metadata,
    sa.Column("item_id", sa.String(32), primary_key=True),
    sa.Column("stream_id", sa.String(36), nullable=False, index=True),
    sa.Column("kind", sa.String(16), nullable=False),  # "memory" | "experience"
    sa.Column("text", SEALED, nullable=False),
    #: The primary category, shown with the memory ("conversation" shows nothing).
    sa.Column("category", sa.String(32), nullable=False),
    #: JSON list of every category the memory reveals, primary first; a read serves the
    #: memory only if all are allowed. ``["*"]`` (rows from before the column) stands
    #: for every category until a rebuild derives them (decision 0016).
    sa.Column("categories", sa.Text, nullable=False),
    sa.Column("importance", sa.Float, nullable=False),
    sa.Column("provenance", sa.String(16), nullable=False),
    sa.Column("evidence", sa.Text, nullable=False),
    sa.Column("source_refs", SEALED, nullable=False),
    sa.Column("owner_agent", sa.String(128), nullable=False),
    sa.Column("sharing", sa.String(256), nullable=False),
    sa.Column("author", sa.String(64), nullable=False),
    sa.Column("actor", SEALED, nullable=False),
    sa.Column("session_id", SEALED, nullable=False),
    sa.Column("session_key", sa.String(32), nullable=False),
    sa.Column("occurred_at", TZ, nullable=False),
    sa.Column("recorded_at", TZ, nullable=False),
    sa.Column("visits", sa.Integer, nullable=False, default=0),
    sa.Column("last_visited_at", TZ, nullable=True),
    sa.Column("archived", sa.Boolean, nullable=False, default=False),
    sa.Column("embedding", SEALED, nullable=True),
    sa.Column("detail", SEALED, nullable=False),
)

intents = sa.Table(
    "intents",
    metadata,
    sa.Column("item_id", sa.String(32), primary_key=True),
    sa.Column("stream_id", sa.String(36), nullable=False, index=True),
    sa.Column("description", SEALED, nullable=False),
    sa.Column("category", sa.String(32), nullable=False),
    sa.Column("confidence", sa.Float, nullable=False),
    sa.Column("provenance", sa.String(16), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("evidence", sa.Text, nullable=False),
    sa.Column("owner_agent", sa.String(128), nullable=False),
    sa.Column("sharing", sa.String(256), nullable=False),
    sa.Column("author", sa.String(64), nullable=False),
    sa.Column("expires_at", TZ, nullable=True),
    sa.Column("observed_at", TZ, nullable=False),
    sa.Column("status_changed_at", TZ, nullable=True),
)

consents = sa.Table(
    "consents",
    metadata,
    sa.Column("consent_id", sa.String(32), primary_key=True),
    sa.Column("stream_id", sa.String(36), nullable=False, index=True),
    sa.Column("app_id", sa.String(128), nullable=False),
    sa.Column("categories", sa.Text, nullable=False),
    sa.Column("purposes", sa.Text, nullable=False),
    sa.Column("legal_basis", sa.String(64), nullable=False),
    sa.Column("granted_at", TZ, nullable=False),
    sa.Column("expires_at", TZ, nullable=True),
    sa.Column("withdrawn_at", TZ, nullable=True),
    sa.Column("erase_requested", sa.Boolean, nullable=False, default=False),
    #: Log positions (notification ids) of the grant and of the withdrawal: what a
    #: withdrawal with erase collects is bounded by them, on the same clock as the
    #: captures' ``notification_id``. NULL in rows projected before migration
    #: 0005_views_consent_positions (until ``uprof projections rebuild``); the
    #: collection then falls back to the times (decision 0055).
    sa.Column("granted_position", sa.BigInteger, nullable=True),
    sa.Column("withdrawn_position", sa.BigInteger, nullable=True),
)

#: Captures per session, the "interactions" term of MemoryOS heat.
session_activity = sa.Table(
    "session_activity",
    metadata,
    sa.Column("stream_id", sa.String(36), primary_key=True),
    sa.Column("session_key", sa.String(32), primary_key=True),
    sa.Column("captures", sa.Integer, nullable=False),
    sa.Column("last_at", TZ, nullable=False),
)

#: Which app read which item when, for the privacy center ("who read this").
item_reads = sa.Table(
    "item_reads",
    metadata,
    sa.Column("stream_id", sa.String(36), primary_key=True),
    sa.Column("item_id", sa.String(32), primary_key=True),
    sa.Column("app_id", sa.String(128), primary_key=True),
    sa.Column("purpose", sa.String(64), primary_key=True),
    sa.Column("reads", sa.Integer, nullable=False),
    sa.Column("last_read_at", TZ, nullable=False),
)

#: Tables holding a subject's data, in the order the erasure cascade purges them.
SUBJECT_TABLES = (
    item_reads,
    session_activity,
    consents,
    intents,
    memories,
    attributes,
    captures,
    subjects,
)
