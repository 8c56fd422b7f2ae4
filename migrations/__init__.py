"""Alembic migrations for every table uprof owns (not the eventsourcing tables)."""
