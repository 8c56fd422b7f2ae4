"""Bug YF: the schema lock's wait message named the database by the URL's parts before its
query. A URL that gives the host, port or database in the query string (SQLAlchemy's
documented Unix-socket form, ``?host=``; accepted since 0248-review-of-0244-and-0247)
was named "at None:5432", and a ``?dbname=`` one by no database, while the engines
reached the database the query names. The message now names what libpq is handed."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.conftest import Backend


def _wait_given_up_message(url: str, held_on: str) -> str:
    """The refusal of a start that waited 0.2 s for the schema lock of the database at
    ``url``, held by another session on ``held_on`` (the same database)."""
    from uprof.backends import SchemaLockWaitError
    from uprof.backends.postgres import POSTGRES, SCHEMA_LOCK_KEY

    holder = sa.create_engine(held_on)
    engine = sa.create_engine(url)
    try:
        with holder.connect() as other:
            other.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": SCHEMA_LOCK_KEY})
            other.commit()
            with (
                pytest.raises(SchemaLockWaitError) as refused,
                POSTGRES.schema_lock(engine, wait_s=0.2, purpose="test"),
            ):
                pytest.fail("went on without the lock")
            other.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": SCHEMA_LOCK_KEY})
            other.commit()
    finally:
        engine.dispose()
        holder.dispose()
    return str(refused.value)


@pytest.mark.parametrize("form", ["host in the query", "all in the query"])
def test_yf_the_wait_names_the_host_port_and_database_the_query_gives(
    empty_backend: Backend, form: str
) -> None:
    if empty_backend.kind != "postgres":
        pytest.skip("a PostgreSQL URL's query string (SQLite: a lock file)")
    given = sa.engine.make_url(empty_backend.url)
    # Written out: ``URL.set`` takes None as "leave it", so it cannot take a part out.
    at = f"host={given.host}&port={given.port}"
    user = f"{given.username}@"
    url = (
        f"postgresql+psycopg://{user}/{given.database}?{at}"
        if form == "host in the query"
        else f"postgresql+psycopg://{user}/?{at}&dbname={given.database}"
    )
    assert sa.engine.make_url(url).host is None
    said = _wait_given_up_message(url, empty_backend.url)
    assert f"the PostgreSQL database {given.database} at {given.host}:{given.port}" in said
    assert "None" not in said
