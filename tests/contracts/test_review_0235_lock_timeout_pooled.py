"""Review of 0235-key-checks-around-the-locks (decision 0244-review-of-0235-to-0242),
held: the key store's bounded lock wait (bug WK, ``lock_timeout`` of 1.5 s set for a
read's transaction) does not stay on the pooled connection. Had it leaked, a later,
unrelated statement on that connection (a migration's, a revocation's) would fail at
1.5 s. PostgreSQL's (SQLite's key reads set nothing: WAL readers do not wait)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.conftest import Backend
from uprof.api import ApiKeyStore
from uprof.apikeys.store import KEY_READ_LOCK_WAIT_S


def _lock_timeout(engine: sa.Engine) -> str:
    with engine.connect() as conn:
        return str(conn.execute(sa.text("SHOW lock_timeout")).scalar_one())


def test_held_the_key_reads_lock_wait_stays_in_its_transaction(backend: Backend) -> None:
    if backend.kind != "postgres":
        pytest.skip("SQLite's key reads bound nothing (WAL readers do not wait)")
    # One pooled connection: every read and every check below takes the same one.
    engine = sa.create_engine(backend.url, pool_size=1, max_overflow=0)
    other = sa.create_engine(backend.url, poolclass=sa.pool.NullPool)
    try:
        store = ApiKeyStore(engine, tenant="default")
        issued = store.create("app:pooled")
        before = _lock_timeout(engine)
        with store._reading() as conn:  # the bound is there, inside the read
            inside = conn.execute(sa.text("SHOW lock_timeout")).scalar_one()
        assert inside == f"{int(KEY_READ_LOCK_WAIT_S * 1000)}ms"
        assert store.is_live(issued.info.key_id)
        assert store.list()
        assert _lock_timeout(engine) == before  # a read that succeeded left nothing

        # A read that met another session's lock and failed: its transaction rolled
        # back on an error, the connection back in the pool.
        with other.connect() as holder:
            holder.execute(sa.text("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE"))
            with pytest.raises(sa.exc.OperationalError):
                ApiKeyStore(engine, tenant="default").live_app_of(issued.info.key_id)
            holder.rollback()
        assert _lock_timeout(engine) == before
        assert store.live_app_of(issued.info.key_id) == "app:pooled"
    finally:
        engine.dispose()
        other.dispose()
