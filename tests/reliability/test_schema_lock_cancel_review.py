"""0213-flakes-under-load's cancel thread attacked (0216-review-of-0211-to-0214, Held): a
PostgreSQL waiter for an advisory lock stays in the server's queue and a thread of its own
cancels the wait (psycopg's ``cancel_safe``) once a stop is asked.

- A stop asked as the lock is granted: the take answers what the server holds (True with
  the lock held, False with it not held), never a lock held unknown to the caller.
- The cancel never reaches the connection's NEXT statement (PostgreSQL's known hazard of
  a cancel sent as a statement ends): the watcher is joined before the take returns.
- A waiter killed with SIGKILL while queued does not keep the lock from the next one.
Real sessions on a database of the test's own; real processes for the kill."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.conftest import Backend
from uprof.backends.postgres import _holds_advisory, _poll_advisory

#: An advisory lock key of this test's own (the database is too).
_KEY = 7_213_021_314
_TRY = "pg_try_advisory_lock"
#: Rounds of the race: the release falls before, at, and after the watcher's look.
_ROUNDS = 24


@pytest.mark.parametrize("empty_backend", ["postgres"], indirect=True)
def test_held_a_stop_crossing_the_grant_never_leaks_the_lock_nor_cancels_the_next_statement(
    empty_backend: Backend,
) -> None:
    engine = sa.create_engine(empty_backend.url, pool_size=2)
    rng = random.Random(213)
    outcomes: list[bool] = []
    try:
        with engine.connect() as holder, engine.connect() as waiter:
            for _ in range(_ROUNDS):
                holder.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": _KEY})
                holder.commit()
                stop = threading.Event()
                got: list[bool] = []
                thread = threading.Thread(target=_take, args=(waiter, stop, got))
                thread.start()
                time.sleep(0.1)  # queued behind the holder
                stop.set()
                # The release somewhere in the watcher's next look (every 0.25 s).
                time.sleep(rng.uniform(0.0, 0.3))
                holder.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": _KEY})
                holder.commit()
                thread.join(timeout=60)
                assert got, "the take never returned"
                held = _holds_advisory(waiter, _KEY, shared=False)
                assert got[0] == held, f"the take said {got[0]}, the server says {held}"
                outcomes.append(got[0])
                # The next statement on the same session runs to its end, not cancelled.
                slept = waiter.execute(sa.text("SELECT pg_sleep(0.3), 1")).one()
                waiter.commit()
                assert slept[1] == 1
                if held:
                    waiter.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": _KEY})
                    waiter.commit()
    finally:
        engine.dispose()
    assert False in outcomes, f"no round cancelled the wait: {outcomes}"


def _take(waiter: sa.Connection, stop: threading.Event, got: list[bool]) -> None:
    got.append(_poll_advisory(waiter, _TRY, _KEY, time.monotonic() + 30, stop.is_set))


_QUEUED_WAITER = textwrap.dedent(
    """
    import sys
    import sqlalchemy as sa
    engine = sa.create_engine(sys.argv[1])
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT set_config('application_name', 'killed-waiter', false)"))
        print("queued", flush=True)
        conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": int(sys.argv[2])})
        print("granted", flush=True)
        import time; time.sleep(600)
    """
)


@pytest.mark.parametrize("empty_backend", ["postgres"], indirect=True)
def test_held_a_waiter_killed_in_the_queue_does_not_keep_the_lock(
    empty_backend: Backend, tmp_path: Path
) -> None:
    engine = sa.create_engine(empty_backend.url)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    try:
        with engine.connect() as holder, engine.connect() as third:
            holder.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": _KEY})
            holder.commit()
            waiter = subprocess.Popen(
                [sys.executable, "-c", _QUEUED_WAITER, empty_backend.url, str(_KEY)],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            try:
                assert waiter.stdout is not None and waiter.stdout.readline() == "queued\n"
                _until(lambda: _waiting(third) == 1)
                waiter.send_signal(signal.SIGKILL)
            finally:
                waiter.wait(timeout=60)
                if waiter.stdout is not None:
                    waiter.stdout.close()
            holder.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": _KEY})
            holder.commit()
            # The killed waiter's session is granted the lock and ends at its reply: the
            # third session's own take then succeeds (a blocking take, bounded).
            third.execute(sa.text("SET lock_timeout = '60s'"))
            third.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": _KEY})
            assert _holds_advisory(third, _KEY, shared=False)
            third.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": _KEY})
            third.commit()
    finally:
        engine.dispose()


def _waiting(conn: sa.Connection) -> int:
    count = conn.execute(
        sa.text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND objid::bigint = :low"
        ),
        {"low": _KEY & 0xFFFFFFFF},
    ).scalar_one()
    conn.commit()
    return int(count)


def _until(condition: object, bound_s: float = 60.0) -> None:
    assert callable(condition)
    give_up = time.monotonic() + bound_s
    while not condition():
        assert time.monotonic() < give_up, "not reached within the bound"
        time.sleep(0.05)
