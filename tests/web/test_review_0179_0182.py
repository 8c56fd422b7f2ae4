"""Review of decisions 0179, 0181 and 0182, attacked from outside on SQLite and
PostgreSQL: each test failed on main before its fix, or says it held."""

from __future__ import annotations

import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from tests.api.conftest import Apps, LiveServer, bearer, grant
from tests.conftest import Backend
from tests.web.conftest import link_token, privacy_link, table_gone
from uprof.api.errors import store_outage
from uprof.kernel import Uprof


def test_a_missing_table_is_a_fault_on_both_backends_not_an_outage(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof, backend: Backend
) -> None:
    """Bug NR: 0182 (NH) took every ``OperationalError`` for the database not answering.
    SQLite's driver raises that class for a malformed statement too (``no such table``,
    ``no such column``, a syntax error: SQLITE_ERROR), where PostgreSQL's raises
    ``ProgrammingError``: the same missing table was 503 ``store_unavailable`` "retry
    later" on SQLite and 500 ``internal`` on PostgreSQL. Waiting mends no schema: a fault
    on both. The privacy link is still kept (nothing decided about it)."""
    grant(http, apps.planner)
    login = privacy_link(http, apps.planner_operator, "alice")
    # A connection per request: the server ends the one it answered a fault (500) on,
    # and the next request must not race that end.
    with httpx.Client(base_url=server.url, timeout=120, headers={"Connection": "close"}) as browser:
        token = link_token(browser, login)
        with table_gone(backend, kernel, "subject_index"):
            # Its own connection: the server ends one that a fault (500) was answered on.
            with httpx.Client(base_url=server.url, timeout=120) as operator:
                rest = operator.post(
                    "/v1/privacy/links",
                    headers=bearer(apps.planner_operator),
                    json={"subject": "alice"},
                )
            refused = browser.post("/privacy/login", data={"token": token})
        signed = browser.post("/privacy/login", data={"token": token})
    assert rest.status_code == 500, (rest.status_code, rest.text[:300])
    assert rest.json()["error"]["code"] == "internal"
    assert "Retry-After" not in rest.headers
    assert refused.status_code == 500, (refused.status_code, refused.text[:300])
    assert "Retry-After" not in refused.headers
    assert signed.status_code == 303, signed.text[:300]


def _sqlite_error(statement: str, *, setup: str = "") -> sa.exc.DBAPIError:
    """The error SQLAlchemy raises for ``statement`` on a real SQLite database."""
    engine = sa.create_engine("sqlite://")
    try:
        with engine.connect() as conn:
            if setup:
                conn.exec_driver_sql(setup)
            conn.exec_driver_sql(statement)
    except sa.exc.DBAPIError as error:
        return error
    finally:
        engine.dispose()
    raise AssertionError(f"{statement!r} did not fail")


@pytest.mark.parametrize(
    "statement",
    ["SELECT nope FROM sqlite_master", "SELECT * FROM no_such_table", "SELEKT 1"],
)
def test_sqlite_statement_errors_are_not_outages(statement: str) -> None:
    """Bug NR, at the one owner of the rule: a statement SQLite cannot run is a fault."""
    error = _sqlite_error(statement)
    assert isinstance(error, sa.exc.OperationalError)  # why NH took it for an outage
    assert store_outage(error) is None


def test_sqlite_busy_and_unopenable_stores_are_outages(tmp_path: Path) -> None:
    """What SQLite says when it does not answer stays an outage (held)."""
    folder = tmp_path / "a"
    folder.mkdir()
    path = folder / "db.sqlite"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        engine = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
        with pytest.raises(sa.exc.OperationalError) as busy, engine.connect() as conn:
            conn.exec_driver_sql("SELECT * FROM t")
        engine.dispose()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert store_outage(busy.value) is not None
    missing = sa.create_engine(f"sqlite:///{folder / 'no' / 'db.sqlite'}")
    with pytest.raises(sa.exc.OperationalError) as unopenable:
        missing.connect()
    assert store_outage(unopenable.value) is not None


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_fifty_concurrent_decisions_on_a_healthy_postgres_are_all_served(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof, backend: Backend
) -> None:
    """Held (0182, NK): the policy store's pool (1 connection, 5 more on demand) waits
    2 s for a connection now. Under 50 concurrent requests each deciding by the policy,
    over rounds spaced past the policy's refresh bound (so that version checks are due),
    no healthy request is refused as an outage: the checks read one at a time, under the
    policy's lock."""
    grant(http, apps.planner)

    def ask(_: int) -> int:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            return client.get("/v1/policy", headers=bearer(apps.planner_operator)).status_code

    statuses: list[int] = []
    with ThreadPoolExecutor(max_workers=50) as pool:
        for _ in range(3):
            statuses += pool.map(ask, range(50))
            time.sleep(kernel.settings.policy_refresh_s * 2)  # the next check due
    assert statuses == [200] * 150, sorted(set(statuses))
