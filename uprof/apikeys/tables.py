"""The API-key table.

Declared on its own ``MetaData`` with the shared naming convention; the ``keys``
alembic branch creates it (it lives beside the key store: both are credentials,
backed up on the same policy).
"""

from __future__ import annotations

import sqlalchemy as sa

from domain.naming import NAMING_CONVENTION

metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)

#: One row per issued key. Only a SHA-256 of the secret part is stored: the key is
#: 256 bits of randomness, so a slow password hash would add latency and no safety.
#: ``roles`` is a space-separated set (e.g. "app operator"); ``revoked_at`` set = dead.
#: ``tenant``: the deployment tenant the key was issued in, the only one it opens (NULL:
#: issued before keys named their tenant, accepted in any).
api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("key_id", sa.String(32), primary_key=True),
    sa.Column("app_id", sa.String(128), nullable=False, index=True),
    sa.Column("key_hash", sa.String(64), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("roles", sa.String(256), nullable=False, server_default="app"),
    sa.Column("tenant", sa.String(128), nullable=True),
)
