"""A process of the previous release (decision 0158) holding a keyed withdrawal's turn,
for ``test_turn_locks_across_releases``. Its lock is written out here as that release
took it (``git show 260ddd9:uprof/backends/sqlite.py``, ``.../postgres.py``,
``.../services/idempotency.py``, ``.../kernel.py``), not through this release's code:
the API-key revocation lock was ``apikey-revocation`` of the key store; the key's turn was
one of 256 shard locks, ``idempotency-turn-<int(token[:8], 16) % 256>``, taken
exclusively; on SQLite an flock of the file ``<views database>.<name>-lock`` beside the
database, on PostgreSQL a session advisory lock on 64 bits of
``sha256("uprof/named-lock/<name>")``."""

from __future__ import annotations

import fcntl
import hashlib
import os
from typing import Any

import sqlalchemy as sa

#: The previous release's shard count (decision 0158).
SHARDS = 256


def shard_name(token: str) -> str:
    return f"idempotency-turn-{int(token[:8], 16) % SHARDS}"


def hold_previous_turn(views_url: str, token: str, holding: Any, release: Any) -> None:
    """Hold ``token``'s turn as the previous release does until ``release`` is set
    (the first request of a keyed erasing withdrawal, still running there); exit 3 if
    the turn is not free (a holder of this release has it)."""
    hold_previous_release_lock(views_url, shard_name(token), holding, release)


def hold_previous_release_lock(url_text: str, name: str, holding: Any, release: Any) -> None:
    """Hold the named lock ``name`` of the store at ``url_text`` as the previous release
    took it until ``release`` is set; exit 3 if it is not free."""
    url = sa.engine.make_url(url_text)
    if url.get_backend_name() == "sqlite":
        fd = os.open(f"{url.database}.{name}-lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os._exit(3)
        holding.set()
        release.wait(120)
        os.close(fd)
        return
    digest = hashlib.sha256(f"uprof/named-lock/{name}".encode()).digest()
    key = int.from_bytes(digest[:8], "big", signed=True)
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            if not conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar():
                os._exit(3)
            conn.commit()
            holding.set()
            release.wait(120)
    finally:
        engine.dispose()
