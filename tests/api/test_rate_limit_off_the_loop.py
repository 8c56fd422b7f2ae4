"""A rate-limit check that waits for the database never holds up the server's other
requests (review of 0115, bug BF; SQLite and PostgreSQL, a live server).

Since decision 0115 a check is a database transaction that may wait: on SQLite for the
views file's write lock (up to the 30 s busy timeout: another process's write, an
operator's ``sqlite3`` session in ``BEGIN IMMEDIATE``), on PostgreSQL for the bucket's
lock or a pooled connection. REST ran it in ``authenticate``, an ``async`` dependency,
that is on the event loop: while one request's check waited, no other request of the
process was served at all, ``/healthz`` included.

Here the counters' table is held by another connection; a rate-limited request is sent
and seen to enter its check; then ``/healthz`` must be answered while the lock is still
held. Only the order is asserted: the holder lets go after a generous 15 s whatever
happens, and the test fails if ``/healthz`` was only answered after that.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import sqlalchemy as sa

from tests.api.conftest import Apps, LiveServer, bearer, grant
from tests.conftest import Backend
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.server import create_server

GIVE_UP_S = 15.0


@contextmanager
def _counters_held(kernel: Uprof, backend: Backend) -> Iterator[threading.Event]:
    """Hold the counters' table from another connection until the yielded event is set
    (or ``GIVE_UP_S`` passed); yields the event set when the holder gave up waiting."""
    release = threading.Event()
    locked = threading.Event()
    gave_up = threading.Event()
    engine = kernel.views_engine

    def hold() -> None:
        if backend.kind == "postgres":
            with engine.connect() as conn, conn.begin():
                conn.exec_driver_sql("LOCK TABLE rate_limit_slots IN ACCESS EXCLUSIVE MODE")
                locked.set()
                if not release.wait(GIVE_UP_S):
                    gave_up.set()
        else:
            # An operator's sqlite3 session holding the write lock, through the driver.
            assert engine.url.database
            raw = sqlite3.connect(engine.url.database, isolation_level=None)
            try:
                raw.execute("BEGIN IMMEDIATE")
                locked.set()
                if not release.wait(GIVE_UP_S):
                    gave_up.set()
                raw.execute("ROLLBACK")
            finally:
                raw.close()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert locked.wait(10), "could not take the lock"
    try:
        yield gave_up
    finally:
        release.set()
        holder.join(GIVE_UP_S + 5)


def test_a_waiting_check_does_not_stop_other_requests(
    kernel: Uprof, keys: ApiKeyStore, apps: Apps, backend: Backend
) -> None:
    counters = kernel.rate_counters
    assert counters is not None
    entered = threading.Event()

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        # The check's first statement that waits for the holder (only observed).
        if "BEGIN IMMEDIATE" in statement or "rate_limit_slots" in statement:
            entered.set()

    with (
        LiveServer(create_server(kernel, keys, rate_limit="100/minute")) as live,
        httpx.Client(base_url=live.url, timeout=60) as http,
        httpx.Client(base_url=live.url, timeout=60) as probe,
    ):
        grant(http, apps.planner)
        results: list[httpx.Response] = []
        sa.event.listen(counters._engine, "before_cursor_execute", seen)
        try:
            with _counters_held(kernel, backend) as gave_up:
                entered.clear()
                limited = threading.Thread(
                    target=lambda: results.append(
                        http.post(
                            "/v1/consents/list",
                            headers=bearer(apps.planner),
                            json={"subject": "alice"},
                        )
                    ),
                    daemon=True,
                )
                limited.start()
                assert entered.wait(10), "the limited request never reached its check"
                health = probe.get("/healthz")
                answered_while_held = not gave_up.is_set()
        finally:
            sa.event.remove(counters._engine, "before_cursor_execute", seen)
        limited.join(60)

    assert health.status_code == 200, health.text
    assert answered_while_held, "/healthz waited for another request's rate-limit check"
    # The waiting request was counted and served once the lock was let go.
    assert [r.status_code for r in results] == [200], [r.text for r in results]
