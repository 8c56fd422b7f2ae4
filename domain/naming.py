"""The one naming convention for every table uprof owns.

Alembic needs stable constraint and index names to compare and migrate them. It lives
in the lowest layer because three layers own tables (uprof's key and API stores, the
projections, the audit log) and each may import only downwards.
"""

NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
