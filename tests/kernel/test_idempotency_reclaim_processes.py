"""Reclaiming an expired idempotency key beside other processes (SQLite and PostgreSQL,
real processes).

Left by the review of decision 0115 (0116): ``IdempotencyStore._claim`` read an expired
key's row and deleted it in one ``engine.begin()``. Since 0115 every rate-limited request
of every server process commits to the views file (``rate_limit_slots``); on SQLite, a
deferred transaction that has read and then writes after another process's commit fails
with ``SQLITE_BUSY_SNAPSHOT``, which no busy timeout retries. Whether the read was part of
that transaction depended on the driver: pysqlite's default (the one uprof runs) begins
a transaction only at the first INSERT, UPDATE or DELETE, so the read ran on its own and
the reclaim held; with the transaction begun at the first statement (SQLAlchemy's
documented pysqlite recipe for SAVEPOINT support, Python 3.12's ``autocommit=False``) the
read joined it and the reclaim failed (``eager`` below). The reclaim is now a read
followed by one conditional DELETE in a transaction of its own: no transaction of it reads
and then writes, whatever the driver does.

And two processes reclaiming the same expired key at once must give one write and one
answer (I14), on both backends.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, settings_for
from tests.kernel.idem_child import before_first, keyed_capture, reclaim_at_once
from tests.kernel.test_idempotency import captured, stored_rows
from uprof.backends import backend_for_url
from uprof.services.idempotency import IdempotencyStore

#: Another server process counting one rate-limited request: a commit to the views store.
COUNT_A_REQUEST = """
import sys
from limits import parse_many
from uprof.backends import backend_for_url
from uprof.services.rate_limits import RateCounters, bucket_of

url = sys.argv[1]
engine = backend_for_url(url).create_engine(url, fsync_each_commit=False)
try:
    assert RateCounters(engine).hit(bucket_of("test", "caller"), parse_many("100/minute")) is None
finally:
    engine.dispose()
print("counted", flush=True)
"""


def _eager_begin(engine: sa.Engine) -> None:
    """Begin SQLite's transaction at the first statement, reads included."""

    @sa.event.listens_for(engine, "connect")
    def _no_lazy_begin(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @sa.event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN")


@pytest.fixture
def views_url(backend: Backend) -> Iterator[str]:
    kernel = build_kernel(settings_for(backend), FakeClock())  # creates the views store
    try:
        yield kernel.views_engine.url.render_as_string(hide_password=False)
    finally:
        kernel.close()


@pytest.mark.parametrize("begin", ["default", "eager"])
def test_a_commit_from_another_process_between_the_reclaims_read_and_write(
    backend: Backend, views_url: str, begin: str
) -> None:
    if begin == "eager" and backend.kind != "sqlite":
        pytest.skip("a SQLite driver mode")
    engine = backend_for_url(views_url).create_engine(views_url, fsync_each_commit=False)
    if begin == "eager":
        _eager_begin(engine)
    now = [1_000_000]
    store = IdempotencyStore(
        engine, b"s" * 32, tenant="t", retention_s=60.0, clock_ms=lambda: now[0]
    )
    try:

        def write(_token: str) -> tuple[dict[str, Any], int]:
            return {"written_at": now[0]}, 201

        first = store.run("app:a", "key-1", "capture", {"text": "x"}, write)
        now[0] += 61_000  # past the key's retention
        store._last_purge = time.monotonic()  # purged a moment ago: the row is still there

        def another_process_commits() -> None:
            done = children.run_python(COUNT_A_REQUEST, views_url, timeout=120)
            assert done.returncode == 0 and "counted" in done.stdout, done.stderr[-3000:]

        # The reclaim has read the expired row when the other process commits.
        before_first(engine, "DELETE FROM IDEMPOTENCY_KEYS", another_process_commits)
        again = store.run("app:a", "key-1", "capture", {"text": "x"}, write)

        assert not first.replayed and not again.replayed
        assert again.response == {"written_at": now[0]} != first.response
        assert store.count() == 1
    finally:
        engine.dispose()


def test_two_processes_reclaiming_one_expired_key_at_once_write_once(backend: Backend) -> None:
    settings = settings_for(backend)
    setup = build_kernel(settings, FakeClock())
    try:
        consent(setup)
        first = keyed_capture(setup, "key-1", "I like green tea")
    finally:
        setup.close()
    ctx = children.CONTEXT
    barrier, out = ctx.Barrier(2), ctx.Queue()
    hours = 25  # past the default retention (24 h): the row has expired, the stream forgot
    racers = [
        ctx.Process(target=reclaim_at_once, args=(settings, "key-1", hours, barrier, out))
        for _ in range(2)
    ]
    for p in racers:
        p.start()
    answers = [out.get(timeout=120) for _ in racers]
    for p in racers:
        p.join(60)
        assert p.exitcode == 0
    kernel = build_kernel(settings, FakeClock())
    try:
        ids = captured(kernel)
        # One new write for the key, whichever process made it.
        assert len(ids) == 2 and first.response["capture_id"] in ids, ids
        (a, status_a, _), (b, status_b, _) = answers
        assert a == b and status_a == status_b == 201  # both callers got the one answer
        assert a["capture_id"] in ids and a["capture_id"] != first.response["capture_id"]
        (row,) = stored_rows(kernel)
        assert row.state == "done"
    finally:
        kernel.close()
