"""our partial indexes on eventsourcing's events table (per-subject heads)

Revision ID: 0001_events_head_indexes
Revises: (none)
Create Date: 2026-12-03

The ``events`` branch runs on the event log's store *after* eventsourcing has created
its tables (``ProfilesApplication`` migrates it when it opens): alembic owns no table
here, only two indexes on the library's events table. Per-subject read-your-writes asks
"where is this subject's newest event of a kind?"; each index answers one kind with one
probe at any history length (decision 0007).

``IF NOT EXISTS``: before this revision uprof created the same indexes at run time, so
a store written by an older release already has them and upgrades without a second copy.
The topics are inlined as literals: a planner matches a partial index only to a query
whose condition it can see. ``uprof.eventstore`` builds its queries with the same
conditions (tests/kernel/test_events_migration.py holds the two together).

The column list is the backend's (``Backend.head_index_columns``): SQLite's rowid is the
notification id and rides along in every index, PostgreSQL needs the column named.
"""

from __future__ import annotations

from alembic import op

from uprof.backends import backend_for

revision = "0001_events_head_indexes"
down_revision = None
branch_labels = ("events",)
depends_on = None

#: Index name -> partial-index condition, as created by this revision (never edit: add one).
HEAD_INDEXES = {
    "uprof_head_content": "topic <> 'domain.profile:SubjectProfile.SliceServed'",
    "uprof_head_captured": "topic = 'domain.profile:SubjectProfile.InteractionCaptured'",
}


def upgrade() -> None:
    table, columns = backend_for(op.get_bind()).head_index_target()
    for name, condition in HEAD_INDEXES.items():
        op.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {table} ({columns}) WHERE {condition}")


def downgrade() -> None:
    for name in HEAD_INDEXES:
        op.execute(f"DROP INDEX IF EXISTS {name}")
