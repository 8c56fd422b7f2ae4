"""A start stopped inside an upgrade, and the starts behind it (bug MS), both backends.

The store of ``test_upgrade_processes.previous_schema_store`` (bob's data, a schema
behind). A real ``uprof`` command starts on it and stops itself (SIGSTOP: a debugger,
a frozen container, a laptop lid) inside the upgrade's transaction, holding the schema
lock (an flock on SQLite, an advisory lock on PostgreSQL) and alive. The starts behind
it waited for ever with nothing said. Now a wait says, once it lasts, what it waits
for and who holds it, and ends after ``UPROF_SCHEMA_LOCK_WAIT_S`` with an error naming
both, never going on without the lock. The holder killed or resumed while others wait:
every start comes up and the store is upgraded once.

The harness waits for each child at most ``HARNESS_WAIT_S`` (a hang fails the test, it
does not hang the suite); nothing here asserts how long anything took.
"""

from __future__ import annotations

import contextlib
import os
import signal
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import cli_env, settings_for
from tests.kernel.test_upgrade_processes import (
    assert_upgraded_and_intact,
    previous_schema_store,
)
from uprof.storage import START_PURPOSE

#: The longest the harness waits for a child to reach a point or to end.
HARNESS_WAIT_S = 60.0

#: ``uprof <args>`` as an operator runs it; whoever runs the upgrade's first statement
#: leaves a mark, and the holder (``stop``) then stops itself inside the transaction.
_START = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import sqlalchemy as sa

    out, role = Path(sys.argv[1]), sys.argv[2]

    @sa.event.listens_for(sa.Engine, "after_cursor_execute")
    def _inside(conn, cursor, statement, *rest):
        if "CREATE TABLE rate_limit_slots" in " ".join(statement.split()):
            (out / f"upgrading-{os.getpid()}").touch()
            if role == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)

    sys.argv = ["uprof", *sys.argv[3:]]
    from uprof.cli.main import app
    app()
    """
)
COMMAND = ("projections", "lag")  # any command that opens the stores


def _until(what: str, done: object) -> None:
    deadline = time.monotonic() + HARNESS_WAIT_S
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {HARNESS_WAIT_S} s: {what}"
        time.sleep(0.05)


def _stopped(pid: int) -> bool:
    state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    return state == b"T"


def _flat(text: str) -> str:
    return " ".join(text.split())  # the error is wrapped to the console's width


class _Starts:
    """The children of one test, killed at its end whatever happened."""

    def __init__(self, backend: Backend, out: Path) -> None:
        self.backend, self.out, self.all = backend, out, []

    def start(
        self, role: str, wait_s: float | None = None, command: tuple[str, ...] = COMMAND
    ) -> children.PythonChild:
        env = cli_env(self.backend)
        if wait_s is not None:
            env["UPROF_SCHEMA_LOCK_WAIT_S"] = str(wait_s)
        child = children.PythonChild(_START, str(self.out), role, *command, env=env)
        self.all.append(child)
        return child

    def stopped_holder(self) -> children.PythonChild:
        holder = self.start("stop")
        mark = self.out / f"upgrading-{holder.pid}"
        _until("the holder stops inside the upgrade", lambda: mark.exists())
        _until("the holder is stopped", lambda: _stopped(holder.pid))
        return holder

    def upgraders(self) -> set[int]:
        return {int(p.name.split("-")[1]) for p in self.out.glob("upgrading-*")}


@pytest.fixture
def starts(backend: Backend, tmp_path: Path) -> Iterator[_Starts]:
    out = tmp_path / "out"
    out.mkdir()
    made = _Starts(backend, out)
    try:
        yield made
    finally:
        for child in made.all:
            child.send_signal(signal.SIGKILL)  # a stopped process dies of it too
            child.wait(HARNESS_WAIT_S)


def _waiting(child: children.PythonChild) -> bool:
    return "for the schema lock of" in child.stderr_so_far()


def _given_up(
    behind: children.PythonChild,
    holder: children.PythonChild,
    wait_s: int,
    stdout: str,
    stderr: str,
) -> tuple[str, str]:
    """The start ``behind`` (its output ``stdout``, ``stderr``) gave up waiting ``wait_s``
    for the lock ``holder`` holds: exit 1, one report of the wait (more only every 30 s)
    naming the holder, then the error saying it gave up. Returns (report, error)."""
    flat = _flat(stderr)
    assert behind.returncode == 1, (stdout, stderr)
    report, error = flat[: flat.index("error:")], flat[flat.index("error:") :]
    assert report.count("for the schema lock of") == 1, stderr
    assert f"held by pid {holder.pid} " in report, stderr
    assert f"gave up after waiting {wait_s} s (UPROF_SCHEMA_LOCK_WAIT_S)" in error, stderr
    return report, error


def test_a_start_behind_a_stopped_upgrade_says_so_and_gives_up_without_upgrading(
    backend: Backend, clock: FakeClock, starts: _Starts
) -> None:
    settings = previous_schema_store(backend, clock)
    holder = starts.stopped_holder()

    behind = starts.start("wait", wait_s=5)
    try:
        stdout, stderr = behind.communicate(timeout=HARNESS_WAIT_S)
    except Exception:  # main at the time: it waits for ever, and says nothing
        pytest.fail(f"the start behind a stopped upgrade still waits: {behind.stderr_so_far()!r}")
    report, error = _given_up(behind, holder, 5, stdout, stderr)
    # The report names the store and the holder.
    store = "SQLite database" if backend.kind == "sqlite" else "PostgreSQL database"
    assert f"for the schema lock of the {store}" in report, stderr
    if backend.kind == "postgres":
        assert " in PostgreSQL session " in report, stderr
    # Then the error: the holder, what it does and the setting; nothing done.
    assert f"held by pid {holder.pid} " in error, stderr
    assert f"({START_PURPOSE})" in error, stderr  # one turn per start (0256-start-lock-turns)
    assert "nothing was changed" in error, stderr
    assert starts.upgraders() == {holder.pid}  # it never upgraded beside the holder
    assert not stdout

    holder.send_signal(signal.SIGKILL)
    holder.wait(HARNESS_WAIT_S)
    after = starts.start("after")
    stdout, stderr = after.communicate(timeout=HARNESS_WAIT_S)
    assert after.returncode == 0, stderr
    assert starts.upgraders() == {holder.pid, after.pid}
    assert_upgraded_and_intact(settings, clock)


@pytest.mark.parametrize("command", [("worker",), ("serve", "--port", "0")])
def test_a_worker_or_server_behind_a_stopped_upgrade_says_so_and_exits(
    backend: Backend, clock: FakeClock, starts: _Starts, command: tuple[str, ...]
) -> None:
    """The long-running starts: the worker logs through its own handler (text lines with
    a time and a level), the server before uvicorn sets up its logging."""
    previous_schema_store(backend, clock)
    holder = starts.stopped_holder()
    behind = starts.start("wait", wait_s=3, command=command)
    stdout, stderr = behind.communicate(timeout=HARNESS_WAIT_S)
    _given_up(behind, holder, 3, stdout, stderr)
    assert "ready" not in stdout and "Uvicorn running" not in stderr
    assert starts.upgraders() == {holder.pid}
    holder.kill()
    holder.wait(HARNESS_WAIT_S)


@pytest.mark.parametrize("holder_ends", ["killed", "resumed"])
def test_starts_waiting_for_a_stopped_upgrade_all_come_up_once_it_ends(
    backend: Backend, clock: FakeClock, starts: _Starts, holder_ends: str
) -> None:
    settings = previous_schema_store(backend, clock)
    holder = starts.stopped_holder()
    waiting = [starts.start("wait"), starts.start("wait")]  # the default bound: 300 s
    for child in waiting:
        _until("each start behind says it waits", lambda c=child: _waiting(c))  # type: ignore[misc]

    if holder_ends == "killed":
        holder.send_signal(signal.SIGKILL)
    else:
        holder.send_signal(signal.SIGCONT)
    for child in waiting:
        stdout, stderr = child.communicate(timeout=HARNESS_WAIT_S)
        assert child.returncode == 0, stderr
        assert '"caught_up"' in stdout
        assert "took the schema lock of" in stderr
    if holder_ends == "killed":
        assert holder.wait(HARNESS_WAIT_S) == -signal.SIGKILL
        # Its transaction rolled back: exactly one of the others upgraded again.
        assert len(starts.upgraders() - {holder.pid}) == 1
    else:
        assert holder.wait(HARNESS_WAIT_S) == 0
        assert starts.upgraders() == {holder.pid}  # the store was at head for the others
    assert_upgraded_and_intact(settings, clock)


def test_a_bound_of_0_waits_without_a_limit(
    backend: Backend, clock: FakeClock, starts: _Starts
) -> None:
    previous_schema_store(backend, clock)
    holder = starts.stopped_holder()
    behind = starts.start("wait", wait_s=0)
    _until("the start behind says it waits", lambda: _waiting(behind))
    assert "(no limit, UPROF_SCHEMA_LOCK_WAIT_S)" in _flat(behind.stderr_so_far())
    assert behind.poll() is None
    holder.send_signal(signal.SIGCONT)
    for child in (holder, behind):
        child.communicate(timeout=HARNESS_WAIT_S)
        assert child.returncode == 0
    assert starts.upgraders() == {holder.pid}


# ------------------------------------------------- what a waiter reads of the holder
# SQLite: the record the holder writes into the lock file (and whatever else it holds);
# PostgreSQL: the holder's session, found beside the lock in pg_locks.

#: Holds a SQLite schema lock file as a process of an earlier release did: the flock,
#: and nothing written; whatever the file held stays.
_RAW_FLOCK = textwrap.dedent(
    """
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("held", flush=True)
    time.sleep(600)
    """
)


def _gives_up(stores: Any, engine: Any, purpose: str = "test") -> Exception:
    """``stores``' schema lock (``SQLITE`` or ``POSTGRES``) on ``engine``, which another
    holds: the wait (0.2 s) is given up, the block under it never entered. Returns the
    ``SchemaLockWaitError``."""
    from uprof.backends import SchemaLockWaitError

    with (
        pytest.raises(SchemaLockWaitError) as refused,
        stores.schema_lock(engine, wait_s=0.2, purpose=purpose),
    ):
        pytest.fail("went on without the lock")
    return refused.value


def _given_up_beside_a_raw_holder(tmp_path: Path, content: bytes) -> str:
    """The error of a SQLite schema lock wait (0.2 s) while another process holds the
    lock file, which holds ``content``; afterwards, with that holder killed, the lock
    is taken at once, names this process while held, and nobody once let go."""
    import sqlalchemy as sa

    from uprof.backends.sqlite import SCHEMA_LOCK_SUFFIX, SQLITE

    database = tmp_path / "views.sqlite"
    lock_file = Path(f"{database}{SCHEMA_LOCK_SUFFIX}")
    lock_file.write_bytes(content)
    engine = sa.create_engine(f"sqlite:///{database}")
    holder = children.PythonChild(_RAW_FLOCK, str(lock_file), stream_stdout=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        refused = _gives_up(SQLITE, engine)
    finally:
        holder.kill()
        holder.communicate(timeout=HARNESS_WAIT_S)
    with SQLITE.schema_lock(engine, wait_s=HARNESS_WAIT_S, purpose="test"):
        assert f'"pid": {os.getpid()}' in lock_file.read_text()
    assert lock_file.read_bytes() == b""
    engine.dispose()
    return str(refused)


def test_a_dead_holders_record_is_not_named_as_the_holder(tmp_path: Path) -> None:
    """A holder killed (-9) leaves its record in the SQLite lock file; the next holder
    (here one that writes none, as an earlier release) must not be reported as it."""
    import json
    import socket

    from uprof.backends.sqlite import _process_started

    gone = children.PythonChild("pass")
    gone.wait(HARNESS_WAIT_S)
    dead = {"pid": gone.pid, "host": socket.gethostname(), "since": time.time(), "purpose": "x"}
    message = _given_up_beside_a_raw_holder(tmp_path, json.dumps(dead).encode())
    assert (
        "held by a process that did not say who it is "
        f"(the lock file names pid {gone.pid}, which no longer runs" in message
    )
    # A live pid, but not the process that wrote the record (the pid was reused).
    reused = dict(dead, pid=os.getpid(), started=(_process_started(os.getpid()) or 0) + 1)
    message = _given_up_beside_a_raw_holder(tmp_path, json.dumps(reused).encode())
    assert f"names pid {os.getpid()}, which no longer runs" in message


@pytest.mark.parametrize("started", ["absent", None, True, "12"])
def test_a_record_naming_a_live_process_without_its_start_is_not_named(
    tmp_path: Path, started: object
) -> None:
    """Bug NN: a record of this host naming a live process (here pid 1, init) but not
    when it started, or not as a number (never written so by this release, which writes
    ``started``: a hand-written or foreign record) was named as the holder, and
    docs/operations.md tells the operator to end the holder (``kill -9 <pid>``): an
    unrelated process. A live pid is named only when its start time matches."""
    import json
    import socket

    record: dict[str, object] = {
        "pid": 1,
        "host": socket.gethostname(),
        "since": time.time(),
        "purpose": "start: upgrading views and keys",
    }
    if started != "absent":
        record["started"] = started
    message = _given_up_beside_a_raw_holder(tmp_path, json.dumps(record).encode())
    assert "held by pid 1 " not in message, message
    assert "held by a process that did not say who it is (the lock file names pid 1," in message


def test_a_huge_or_binary_lock_file_gives_a_short_printable_report(tmp_path: Path) -> None:
    """Held (0180): whatever a hostile local user writes into the lock file, the report
    reads 4 KiB of it and stays short and printable (no terminal escapes)."""
    import json
    import socket

    long_host = {"pid": os.getpid(), "host": "h" * 10_000, "purpose": "p" * 10_000}
    for content in (
        b"\x1b]0;owned\x07" * 100_000,
        bytes(range(256)) * 5_000,
        json.dumps(dict(long_host, host=socket.gethostname())).encode(),
        json.dumps(long_host).encode(),
    ):
        message = _given_up_beside_a_raw_holder(tmp_path, content)
        held_by = message[message.index("held by") :]
        assert held_by.isprintable() and len(held_by) < 400, held_by


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\xff\xfe\x00 not a record",
        b"[" * 5000,
        b"{" * 100_000,
        b"null",
        b'"pid 5"',
        b'{"pid": -1}',
        b'{"pid": 0}',
        b'{"pid": true}',
        b'{"pid": 1e400}',
        b'{"pid": 99999999999}',
        b'{"pid": "1"}',
    ],
)
def test_a_lock_file_that_holds_no_record_of_ours_does_not_break_the_report(
    tmp_path: Path, content: bytes
) -> None:
    message = _given_up_beside_a_raw_holder(tmp_path, content)
    assert "held by a process that did not say who it is; nothing was changed" in message


def test_a_record_with_hostile_fields_is_named_without_them(tmp_path: Path) -> None:
    hostile = b'{"pid": 7, "host": "\\u001b[2Jh", "purpose": ["x"], "since": "now"}'
    message = _given_up_beside_a_raw_holder(tmp_path, hostile)
    assert "held by pid 7; nothing was changed" in message  # another host: not checked
    assert "\x1b" not in message


def test_a_postgres_holder_that_is_not_a_uprof_start_is_named_by_its_session(
    empty_backend: Backend,
) -> None:
    if empty_backend.kind != "postgres":
        pytest.skip("PostgreSQL's sessions (SQLite: the lock file)")
    import sqlalchemy as sa

    from uprof.backends.postgres import POSTGRES, SCHEMA_LOCK_KEY

    engine = sa.create_engine(empty_backend.url)
    try:
        with engine.connect() as other:
            other.execute(sa.text("SET application_name = 'psql'"))
            session = other.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
            other.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": SCHEMA_LOCK_KEY})
            other.commit()
            refused = _gives_up(POSTGRES, engine)
            other.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": SCHEMA_LOCK_KEY})
            other.commit()
        assert (
            f"held by PostgreSQL session {session} (application_name 'psql'), not a uprof start"
            in str(refused)
        )
        with (
            POSTGRES.schema_lock(engine, wait_s=HARNESS_WAIT_S, purpose="test"),
            engine.connect() as conn,
        ):
            name = conn.execute(
                sa.text(
                    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a "
                    "USING (pid) WHERE l.locktype = 'advisory' AND l.objid::bigint = :low AND "
                    "l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                ),
                {"low": SCHEMA_LOCK_KEY & 0xFFFFFFFF},
            ).scalar_one()
            assert name.startswith(f"uprof {os.getpid()} ") and name.endswith(" test")
    finally:
        engine.dispose()


# ------------------------------------------- a failed start lets go of the stores (MT)

#: An embedded start (the SDK's runtime, a test's ``Uprof``) in a process that lives on
#: after it, which may try again or stay up doing other work: the test's ``backend``
#: from its arguments, ``build_kernel`` and the rest; then what the start does, then a
#: long sleep.
_EMBEDDED_START = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tests.conftest import Backend
    from tests.fakes.ports import FakeClock
    from tests.kernel.conftest import build_kernel, settings_for

    backend = Backend(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
    """
)

#: A start whose upgrade fails (as a wait given up does).
_FAILS_THEN_LIVES = _EMBEDDED_START + textwrap.dedent(
    """
    import uprof.bootstrap

    def failed(engine, branch):
        raise RuntimeError("the upgrade failed")

    uprof.bootstrap.migrate = failed
    try:
        build_kernel(settings_for(backend), FakeClock())
    except RuntimeError:
        print("failed", flush=True)
    time.sleep(600)
    """
)


def _stores_free_once_an_embedded_start_ended(
    backend: Backend, script: str, said: str, *, under_the_lock: bool = False
) -> None:
    """An embedded start (``script``, in a process that lives on) runs until it says
    ``said`` (while this process holds the schema lock, ``under_the_lock``); then the
    stores must be nobody's: a restore's check (``stores_alone``) finds no other holder."""
    from uprof.backends import StoresInUseError, backend_for_settings
    from uprof.storage import layout_for, open_engines

    settings = settings_for(backend)
    stores = backend_for_settings(settings)
    engines = open_engines(layout_for(settings))
    child = None
    try:
        with (
            stores.schema_lock(engines.views, wait_s=HARNESS_WAIT_S, purpose="test holder")
            if under_the_lock
            else contextlib.nullcontext()
        ):
            child = children.PythonChild(
                script, backend.kind, backend.url, str(backend.data_dir), stream_stdout=True
            )
            assert child.stdout is not None and child.stdout.readline().strip() == said
        try:
            with stores.stores_alone(engines.views):
                pass
        except StoresInUseError as refused:
            pytest.fail(f"the start that {said} still holds the stores: {refused}")
    finally:
        engines.dispose()
        if child is not None:
            child.kill()
            child.communicate(timeout=HARNESS_WAIT_S)


def test_a_start_that_fails_under_the_schema_lock_lets_go_of_the_stores(
    backend: Backend,
) -> None:
    """Bug MT: the start's hold on the stores (``hold_open``: what ``uprof restore``
    checks) stayed taken after a failure inside the schema lock, for the life of the
    process; a restore was refused "another uprof process has the stores open"."""
    _stores_free_once_an_embedded_start_ended(backend, _FAILS_THEN_LIVES, "failed")


@pytest.mark.parametrize("value", ["-1", "nan", "soon", str(8 * 24 * 3600)])
def test_a_bad_bound_is_refused_naming_the_setting(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydantic import ValidationError

    from uprof.settings import Settings

    monkeypatch.setenv("UPROF_SCHEMA_LOCK_WAIT_S", value)
    with pytest.raises(ValidationError, match="schema_lock_wait_s"):
        Settings()


def test_a_postgres_holder_name_cut_at_63_bytes_keeps_its_pid_and_time() -> None:
    from uprof.backends.postgres import _HOLDER_NAME, _holder_name

    record = {"pid": 4_194_303, "since": 1_765_000_000.5, "host": "h" * 100, "purpose": "x"}
    name = _holder_name(record)
    assert len(name.encode()) == 63
    parsed = _HOLDER_NAME.match(name)
    assert parsed is not None and parsed.group(1, 2) == ("4194303", "1765000000")


# ------------------------------------- a stop asked for while a start waits (bug NM)


@pytest.mark.parametrize("command", [("worker",), ("serve", "--port", "0")])
def test_a_start_waiting_for_the_schema_lock_stops_on_sigterm(
    backend: Backend, clock: FakeClock, starts: _Starts, command: tuple[str, ...]
) -> None:
    """Bug NM: ``uprof worker`` sent SIGTERM (``systemctl stop``, a pod deleted) while it
    waited for the schema lock went on waiting, up to the whole bound (300 s by default,
    no end with 0), and then started and ran: the supervisor's grace period ran out
    and it was killed (-9). Now the wait ends at the stop, the process exits at once
    (0, as after any SIGTERM; the server, which died of the signal before uvicorn
    handled it, now says so too: bug OA, tests/kernel/test_schema_lock_stops.py), never
    ready, having changed nothing."""
    previous_schema_store(backend, clock)
    holder = starts.stopped_holder()
    behind = starts.start("wait", wait_s=0, command=command)  # 0: it would wait for ever
    _until("the start behind says it waits", lambda: _waiting(behind))
    behind.send_signal(signal.SIGTERM)
    try:
        stdout, stderr = behind.communicate(timeout=HARNESS_WAIT_S)
    except Exception:  # main at ffab3cf: the worker waits on, for ever with a bound of 0
        pytest.fail(f"still waiting after SIGTERM: {behind.stderr_so_far()!r}")
    assert behind.returncode == 0, (stdout, stderr)
    if command == ("worker",):
        assert behind.returncode == 0, stderr
        assert "uprof worker stopped before it started: asked to stop while waiting" in _flat(
            stderr
        ), stderr
    assert "ready" not in stdout and "Uvicorn running" not in stderr
    assert starts.upgraders() == {holder.pid}  # nothing was changed
    # The holder resumed, it finishes alone; the stores are nobody's afterwards.
    holder.send_signal(signal.SIGCONT)
    holder.communicate(timeout=HARNESS_WAIT_S)
    assert holder.returncode == 0


#: An embedded start that gives up its wait for the schema lock.
_GIVES_UP_THEN_LIVES = _EMBEDDED_START + textwrap.dedent(
    """
    from uprof.backends import SchemaLockWaitError

    settings = settings_for(backend).model_copy(update={"schema_lock_wait_s": 0.3})
    try:
        build_kernel(settings, FakeClock())
    except SchemaLockWaitError as e:
        print("gave up", flush=True)
    time.sleep(600)
    """
)


def test_an_embedded_start_that_gives_up_its_wait_lets_go_of_the_stores(
    backend: Backend,
) -> None:
    """Held (0180's MT, for the wait itself): the stores are free for a restore once
    the holder is done, while the process that gave up lives on."""
    _stores_free_once_an_embedded_start_ended(
        backend, _GIVES_UP_THEN_LIVES, "gave up", under_the_lock=True
    )


def test_a_pooled_postgres_connection_is_not_left_named_as_the_holder(
    empty_backend: Backend,
) -> None:
    """Held (0180): the lock's connection goes back to the pool with its session name
    reset, whether the work under the lock ended well or raised, and a waiter that gave
    up never named its session: later work on the pool, and a later waiter reading
    pg_stat_activity, never see a "uprof <pid> ... " session that holds nothing."""
    if empty_backend.kind != "postgres":
        pytest.skip("PostgreSQL's session names (SQLite: the lock file)")
    import sqlalchemy as sa

    from uprof.backends.postgres import POSTGRES

    engine = sa.create_engine(empty_backend.url, pool_size=1, max_overflow=0)
    other = sa.create_engine(empty_backend.url)

    def names() -> list[str]:
        with other.connect() as conn:
            return list(
                conn.execute(
                    sa.text(
                        "SELECT application_name FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                ).scalars()
            )

    try:
        with POSTGRES.schema_lock(engine, wait_s=HARNESS_WAIT_S, purpose="test"):
            assert any(n.startswith(f"uprof {os.getpid()} ") for n in names())
        assert not any(n.startswith("uprof ") for n in names()), names()
        with (
            pytest.raises(RuntimeError),
            POSTGRES.schema_lock(engine, wait_s=HARNESS_WAIT_S, purpose="test"),
        ):
            raise RuntimeError("the upgrade failed")
        assert not any(n.startswith("uprof ") for n in names()), names()
        with engine.connect() as conn:  # the one pooled connection, reused
            assert (
                not conn.execute(sa.text("SHOW application_name")).scalar_one().startswith("uprof ")
            )
        holder = sa.create_engine(empty_backend.url)
        try:
            with POSTGRES.schema_lock(holder, wait_s=HARNESS_WAIT_S, purpose="test"):
                _gives_up(POSTGRES, engine, purpose="waiter")
                assert sum(n.startswith("uprof ") for n in names()) == 1, names()
        finally:
            holder.dispose()
        assert not any(n.startswith("uprof ") for n in names()), names()
    finally:
        engine.dispose()
        other.dispose()
