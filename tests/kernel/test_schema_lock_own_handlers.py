"""Review of 0190 (OA): SIGTERM while a start waits for the schema lock, in a process whose
SIGTERM handler is not Python's default (an embedding program's, or an ignored signal).
Real processes, both backends, behind an upgrade stopped with SIGSTOP (0180's harness).

0190 catches SIGTERM and SIGINT only where they are left to Python's defaults; a handler
of the program's own is left alone. What then happens, held here (docs/operations.md,
"A start waiting for the schema lock"):

- ignored (``SIG_IGN``): nothing; the start waits on, and starts once the lock is free;
- a handler that returns: it runs, the start waits on and starts (the program's wish to
  stop is its own to act on: ``uprof.backends.stop_schema_lock_waits()`` from the handler
  ends the wait, as ``uprof worker`` does);
- a handler that calls ``stop_schema_lock_waits()``: the wait ends with
  ``SchemaLockWaitStopped``, nothing changed;
- a handler that raises (its own exception, or ``sys.exit``): that exception comes out
  of the start at once, nothing changed, and the process, alive on, holds no lock: the
  holder, resumed, finishes, and another start then takes the lock.

Bug PG: on PostgreSQL the wait is a blocking ``pg_advisory_lock`` under a
``lock_timeout``; a handler's exception raised inside it (one of the program's own:
psycopg cancels the query for ``SystemExit`` and ``KeyboardInterrupt`` only) left the
session in its query, and the ROLLBACK on leaving the connection failed ("another
command is already in progress"): that error replaced the program's own exception, so
the program could not catch its stop, and the session, still queued for the lock, was
not dropped. Now the session is dropped (the server ends the request with it, and
would release a lock it was granted).
"""

from __future__ import annotations

import signal
import textwrap
from pathlib import Path

import pytest

from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import cli_env
from tests.kernel.test_schema_lock_wait import (
    HARNESS_WAIT_S,
    _flat,
    _Starts,
    _until,
    _waiting,
    starts,  # noqa: F401 (the fixture)
)
from tests.kernel.test_upgrade_processes import assert_upgraded_and_intact, previous_schema_store

#: A program embedding uprof: its own SIGTERM handling (``how``), then a start. Marks in
#: ``out``: ``handled-<pid>`` when its handler ran, ``views-<pid>``/``keys-<pid>`` for a
#: store it upgraded, ``caught-<pid>`` when the handler's exception came out of the start
#: (it then stays alive until ``go`` exists).
_EMBEDDING = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    import sqlalchemy as sa

    out, how = Path(sys.argv[1]), sys.argv[2]
    pid = os.getpid()
    MARKS = {
        "CREATE TABLE rate_limit_slots": "views",
        "CREATE TABLE destroyed_capture_keys": "keys",
    }

    @sa.event.listens_for(sa.Engine, "after_cursor_execute")
    def _inside(conn, cursor, statement, *rest):
        flat = " ".join(statement.split())
        for table, store in MARKS.items():
            if table in flat:
                (out / f"{store}-{pid}").touch()

    class Stop(Exception):
        pass

    def handler(signum, frame):
        (out / f"handled-{pid}").touch()
        if how == "raises":
            raise Stop("the program's own stop")
        if how == "exits":
            sys.exit(5)
        if how == "stops":
            from uprof.backends import stop_schema_lock_waits
            stop_schema_lock_waits()

    signal.signal(signal.SIGTERM, signal.SIG_IGN if how == "ignored" else handler)
    from uprof.backends import SchemaLockWaitStopped
    from uprof.bootstrap import bootstrap
    from uprof.settings import Settings

    try:
        kernel = bootstrap(Settings())
    except Stop:
        (out / f"caught-{pid}").touch()
        while not (out / "go").exists():
            time.sleep(0.02)
        sys.exit(7)
    except SchemaLockWaitStopped as error:
        print(f"stopped: {error}", file=sys.stderr)
        sys.exit(8)
    kernel.close()
    print("started")
    """
)


def _embedding(made: _Starts, how: str) -> children.PythonChild:
    env = cli_env(made.backend)
    env["UPROF_SCHEMA_LOCK_WAIT_S"] = "0"  # it would wait for ever
    child = children.PythonChild(_EMBEDDING, str(made.out), how, env=env)
    made.all.append(child)
    return child


def _upgraded_by(out: Path, pid: int) -> list[str]:
    return sorted(store for store in ("views", "keys") if (out / f"{store}-{pid}").exists())


@pytest.mark.parametrize("how", ["ignored", "returns", "stops", "raises", "exits"])
def test_sigterm_in_a_wait_with_the_programs_own_handler(
    backend: Backend,
    clock: FakeClock,
    starts: _Starts,  # noqa: F811
    how: str,
) -> None:
    settings = previous_schema_store(backend, clock)
    holder = starts.stopped_holder()
    behind = _embedding(starts, how)
    _until("the start behind says it waits", lambda: _waiting(behind))
    behind.send_signal(signal.SIGTERM)
    if how != "ignored":
        _until("its handler ran", lambda: (starts.out / f"handled-{behind.pid}").exists())

    if how == "stops":
        _, stderr = behind.communicate(timeout=HARNESS_WAIT_S)
        assert behind.returncode == 8, stderr
        assert "stopped: asked to stop while waiting" in _flat(stderr), stderr
    elif how == "exits":
        # ``sys.exit`` in the handler, the common idiom: the exit it asked for, at once
        # (held on main too: psycopg cancels the query for SystemExit and
        # KeyboardInterrupt, not for any other exception, bug PG).
        _, stderr = behind.communicate(timeout=HARNESS_WAIT_S)
        assert behind.returncode == 5 and "Traceback" not in stderr, stderr
    elif how == "raises":
        caught = starts.out / f"caught-{behind.pid}"
        try:
            _until("the exception came out", caught.exists)
        except AssertionError:
            pytest.fail(f"the handler's exception did not end the wait: {behind.stderr_so_far()}")
        assert behind.poll() is None  # alive on, holding nothing
    assert (starts.out / f"handled-{behind.pid}").exists() is (how != "ignored")
    assert _upgraded_by(starts.out, behind.pid) == [], "the start behind changed a store"

    holder.send_signal(signal.SIGCONT)
    holder.communicate(timeout=HARNESS_WAIT_S)
    assert holder.returncode == 0
    if how in ("ignored", "returns"):
        # The start waited on through the signal, then started: the holder had upgraded
        # everything, so it upgraded nothing itself.
        stdout, stderr = behind.communicate(timeout=HARNESS_WAIT_S)
        assert behind.returncode == 0 and "started" in stdout, (behind.returncode, stderr)
    elif how == "raises":
        # Another start takes the lock while the program that caught its exception lives
        # on: no lock (nor, on PostgreSQL, a queued request) was left behind.
        after = starts.start("after", wait_s=60)
        after.communicate(timeout=HARNESS_WAIT_S * 2)
        assert after.returncode == 0, after.stderr_so_far()
        (starts.out / "go").touch()
        behind.communicate(timeout=HARNESS_WAIT_S)
        assert behind.returncode == 7
    assert_upgraded_and_intact(settings, clock)
