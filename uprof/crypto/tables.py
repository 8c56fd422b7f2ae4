"""Key-store tables (owned by alembic, branch ``keys``).

Kept apart from the read models on purpose: on SQLite it is its own file, so it can
have its own backup policy, and the KEK is never stored beside the wrapped DEKs.
"""

from __future__ import annotations

import sqlalchemy as sa

from domain.naming import NAMING_CONVENTION

metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)

#: Lookup from a keyed hash of (tenant, subject reference) to the random stream id.
#: No identifier is stored in plaintext; the row is deleted at erasure.
subject_index = sa.Table(
    "subject_index",
    metadata,
    sa.Column("ref_hash", sa.String(64), primary_key=True),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("stream_id", sa.String(36), nullable=False, unique=True),
    sa.Column("pseudonym", sa.String(64), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

#: Sessions and known identifiers bound to a subject (identity resolution, steps 2-3).
#: Keyed by a keyed hash, so the identifier itself is not stored; deleted at erasure.
subject_aliases = sa.Table(
    "subject_aliases",
    metadata,
    sa.Column("alias_hash", sa.String(64), primary_key=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("stream_id", sa.String(36), nullable=False, index=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

#: One wrapped data key per (stream, version). Destroying the rows shreds the stream.
subject_keys = sa.Table(
    "subject_keys",
    metadata,
    sa.Column("stream_id", sa.String(36), primary_key=True),
    sa.Column("key_version", sa.Integer, primary_key=True),
    sa.Column("wrapped_dek", sa.LargeBinary, nullable=False),
    sa.Column("kek_id", sa.String(64), nullable=False),
    sa.Column("dek_commitment", sa.String(64), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

#: One key per captured event, wrapped by its subject's data key (item-level shredding:
#: destroying it shreds that event and every item sealed under it; destroying the
#: subject's DEK makes all of them unreadable at once, backups included).
capture_keys = sa.Table(
    "capture_keys",
    metadata,
    sa.Column("capture_id", sa.String(32), primary_key=True),
    sa.Column("stream_id", sa.String(36), nullable=False, index=True),
    sa.Column("wrapped_key", sa.LargeBinary, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

#: Streams whose keys were destroyed; their ids are never reused (FIELD-NOTES §3.4).
shredded_streams = sa.Table(
    "shredded_streams",
    metadata,
    sa.Column("stream_id", sa.String(36), primary_key=True),
    sa.Column("shredded_at", sa.DateTime(timezone=True), nullable=False),
)

#: Who destroyed each subject data key: the request whose ``destroy`` deleted it, written
#: in that destroy's own transaction (decision 0141-exact-erasure-attribution). Another
#: erasure of the subject at once cites exactly that request, whatever the audit log
#: holds yet. ``request_id`` is NULL for a destroy no request made (a start re-applying
#: a ledger record written without one, lost keys accepted). No key material: the
#: commitment is the one ``key.created`` and ``key.destroyed`` entries publish.
destroyed_keys = sa.Table(
    "destroyed_keys",
    metadata,
    sa.Column("stream_id", sa.String(36), primary_key=True),
    sa.Column("key_version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("dek_commitment", sa.String(64), nullable=False),
    sa.Column("request_id", sa.String(64), nullable=True),
    sa.Column("destroyed_at", sa.DateTime(timezone=True), nullable=False),
)

#: Who destroyed each capture key: the request whose ``destroy_capture_key`` or subject
#: ``destroy`` deleted it, in the same transaction. An event erasure finding its capture
#: key gone tells its own destruction (an earlier attempt) from a subject erasure's (bug
#: GZ). A capture key a start deleted re-applying the ledger has no row.
destroyed_capture_keys = sa.Table(
    "destroyed_capture_keys",
    metadata,
    sa.Column("capture_id", sa.String(32), primary_key=True),
    sa.Column("stream_id", sa.String(36), nullable=False),
    sa.Column("key_commitment", sa.String(64), nullable=False),
    sa.Column("request_id", sa.String(64), nullable=True),
    sa.Column("destroyed_at", sa.DateTime(timezone=True), nullable=False),
)

#: The deployment's keys that authenticate plaintext event rows (purge signals and
#: quarantine verdicts, ``uprof.crypto.mapper``), wrapped by the KEK like the DEKs. Not
#: per subject: those rows are written after a subject's keys are destroyed. A row's tag
#: names its key id; the newest id tags new rows, older ones still verify theirs.
plain_row_keys = sa.Table(
    "plain_row_keys",
    metadata,
    sa.Column("key_id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("wrapped_key", sa.LargeBinary, nullable=False),
    sa.Column("kek_id", sa.String(64), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

#: The newest version of each subject stream known committed, and a digest of that row,
#: per event log (``log_id``: where the log lives; a copy elsewhere is another log)
#: (decision 0132-stream-head-anchor): kept here, apart from the event store, so that a
#: writer of the event store alone cannot cut a stream short or roll it back unseen.
#: Written after the event commits (it may lag, never lead), only ever raised; deleted
#: with the stream's keys at erasure.
stream_heads = sa.Table(
    "stream_heads",
    metadata,
    sa.Column("log_id", sa.String(32), primary_key=True),
    sa.Column("stream_id", sa.String(36), primary_key=True),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("digest", sa.String(64), nullable=False),
)
