"""Alembic environment: runs on a connection handed in by uprof.storage.

Three branches: ``views`` (read models and the audit log), ``keys`` (the key
store, kept in its own database file on SQLite) and ``events`` (our indexes on the
event log's tables, run once eventsourcing has created them). The eventsourcing
tables are created by eventsourcing itself and are excluded here (FIELD-NOTES §1).
"""

from __future__ import annotations

from alembic import context

from audit.tables import metadata as audit_metadata
from projections.profile.tables import metadata as profile_metadata
from uprof.apikeys.tables import metadata as api_metadata
from uprof.backends import backend_for
from uprof.crypto.tables import metadata as keys_metadata
from uprof.services.erased_keys import metadata as erased_keys_metadata
from uprof.services.idempotency import metadata as idempotency_metadata
from uprof.services.rate_limits import metadata as rate_limits_metadata
from uprof.services.sign_outs import metadata as sign_outs_metadata

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "migrations run through uprof.storage.migrate (every deployment runs it when it "
        "opens), which supplies the database connection; the alembic command line does not"
    )

TARGETS = {
    "views": [
        profile_metadata,
        audit_metadata,
        idempotency_metadata,
        erased_keys_metadata,
        sign_outs_metadata,
        rate_limits_metadata,
    ],
    "keys": [keys_metadata, api_metadata],
    # Only indexes of ours on eventsourcing's events table: no table of alembic's.
    "events": [],
}
target_metadata = TARGETS[config.attributes.get("branch", "views")]

OWN_TABLES = {
    t
    for md in (
        profile_metadata,
        audit_metadata,
        keys_metadata,
        api_metadata,
        idempotency_metadata,
        erased_keys_metadata,
        sign_outs_metadata,
        rate_limits_metadata,
    )
    for t in md.tables
}


def include_object(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
    # eventsourcing owns its tables (events, snapshots, tracking); leave them alone.
    if type_ == "table":
        return name in OWN_TABLES
    return True


context.configure(
    connection=connection,
    target_metadata=target_metadata,
    include_object=include_object,
    render_as_batch=backend_for(connection).alters_in_batches,
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
