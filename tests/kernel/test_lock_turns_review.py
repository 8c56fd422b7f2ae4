"""Review of 0191 (waits take their turn): the turnstile's descriptor, hostile lock files,
named locks beside a greedy holder, a waiter stopped while it holds the turnstile. Real
processes, SQLite and PostgreSQL where the lock is the backend's.

- Bug PH: the schema lock opened its turnstile before the ``try`` that closes the lock
  file's descriptor: a turnstile that could not be opened (another user's, a folder)
  leaked a descriptor on every start that met it.
- Bug PI: every SQLite lock file (schema lock, turnstile, open lock, named locks) was
  opened with ``O_CREAT`` and nothing else: a symbolic link planted under its name made
  uprof create the file it points to, anywhere, and a schema lock's holder truncates and
  writes its file (its record): a link or a hard link to another file emptied that file.
  A folder failed the start with a traceback; a FIFO, another user's file or one others
  may write were used as a lock.
- Bug PJ: ``named_lock`` on SQLite (idempotent requests' turns, the API-key revocation
  lock) still tried every 50 ms, so beside a process that takes it again the moment it
  lets go a waiter waited hundreds of that process's rounds (0191's bug OU, not fixed
  there for these locks); PostgreSQL's queue held.
- Bug PK: a waiter stopped (SIGSTOP) while it held the SQLite turnstile kept every later
  waiter behind it, even once the lock was free (until their bound gave up), and their
  report named only the lock's holder (0191 "Left").

No timed assertions: rounds of the holder are counted, and the harness waits for each
child at most ``HARNESS_WAIT_S``.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests import children
from tests.conftest import Backend, store_from_template
from tests.kernel.conftest import cli_env
from tests.kernel.test_schema_lock_stops import _WITHOUT_DAC_OVERRIDE
from tests.kernel.test_schema_lock_turns import MOST_ROUNDS_WAITED, _rounds, _url
from tests.kernel.test_schema_lock_wait import HARNESS_WAIT_S, _flat, _stopped, _until

#: The start of a child that drops ``CAP_DAC_OVERRIDE`` and ``CAP_DAC_READ_SEARCH`` when
#: it runs as root: file modes then bind it as any user (``test_schema_lock_stops``).
_AS_ANY_USER = _WITHOUT_DAC_OVERRIDE.split("sys.argv = ")[0]

# ------------------------------------------------------------ PH: the turnstile's descriptor

#: Five schema lock takes of ``argv[1]``'s SQLite database; prints the process's open
#: descriptors before and after, and what each take ended in.
_FIVE_TAKES = _AS_ANY_USER + textwrap.dedent(
    """
    import json
    import sqlalchemy as sa
    from uprof.backends import LockFileAccessError
    from uprof.storage import schema_lock

    engine = sa.create_engine(f"sqlite:///{sys.argv[1]}")

    def open_fds():
        return len(os.listdir("/proc/self/fd"))

    before, said = open_fds(), set()
    for _ in range(5):
        try:
            with schema_lock(engine, wait_s=1, purpose="five takes"):
                said.add("took")
        except LockFileAccessError:  # or its LockFileRefusedError
            said.add("LockFileAccessError")
        except Exception as error:
            said.add(type(error).__name__)
    print(json.dumps({"before": before, "after": open_fds(), "said": sorted(said)}))
    """
)


@pytest.mark.parametrize("turnstile", ["unreadable", "folder"])
def test_ph_a_turnstile_that_cannot_be_opened_leaks_no_descriptor(
    tmp_path: Path, turnstile: str
) -> None:
    """Bug PH. main at 1a68357: five refused takes left five more descriptors open (a
    long-lived process that embeds uprof ran out of them), and the folder's take failed
    ``IsADirectoryError``, not naming what to do."""
    database = tmp_path / "views.sqlite"
    turn = Path(f"{database}.schema-turn")
    if turnstile == "folder":
        turn.mkdir()
    else:
        turn.touch(mode=0o600)
        turn.chmod(0)
    done = children.run_python(_FIVE_TAKES, str(database), timeout=HARNESS_WAIT_S)
    assert done.returncode == 0, done.stderr
    counted = json.loads(done.stdout.strip().splitlines()[-1])
    assert counted["said"] == ["LockFileAccessError"], counted
    assert counted["after"] == counted["before"], counted


# ------------------------------------------------------------------ PI: hostile lock files

HOSTILE = [
    "symlink-to-nothing",
    "symlink-to-a-file",
    "hard-link",
    "fifo",
    "folder",
    "another-users-file",
    "writable-by-others",
]
#: What the refusal says the file is.
SAID = {
    "symlink-to-nothing": "a symbolic link",
    "symlink-to-a-file": "a symbolic link",
    "hard-link": "a hard link",
    "fifo": "a FIFO",
    "folder": "a folder",
    "another-users-file": "owned by uid 4242",
    "writable-by-others": "writable by other users",
}
PRECIOUS = "another file's contents\n"


def _plant(kind: str, path: Path, elsewhere: Path) -> Path:
    """A hostile ``path``; returns the file elsewhere that it must never touch."""
    victim = elsewhere / "victim"
    if kind == "symlink-to-nothing":
        path.symlink_to(victim)
    elif kind == "symlink-to-a-file":
        victim.write_text(PRECIOUS)
        path.symlink_to(victim)
    elif kind == "hard-link":
        victim.write_text(PRECIOUS)
        os.link(victim, path)
    elif kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "folder":
        path.mkdir(mode=0o700)
    elif kind == "another-users-file":
        path.touch(mode=0o600)
        os.chown(path, 4242, 4242)
    else:
        path.touch(mode=0o600)
        path.chmod(0o666)
    return victim


@pytest.fixture
def sqlite_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    with store_from_template(request, "sqlite", tmp_path / "store") as store:
        yield store


@pytest.mark.parametrize("kind", HOSTILE)
@pytest.mark.parametrize("lock_file", ["views.sqlite.schema-turn", "views.sqlite.schema-lock"])
def test_pi_a_hostile_lock_file_is_refused_and_nothing_elsewhere_is_touched(
    sqlite_store: Backend, tmp_path: Path, lock_file: str, kind: str
) -> None:
    """Bug PI (SQLite: PostgreSQL's locks are the server's). main at 1a68357: a link's
    target created or emptied, a hard-linked file emptied, a folder's traceback, a FIFO
    and other users' files taken for lock files."""
    from tests.kernel.conftest import settings_for

    env = cli_env(sqlite_store)
    path = settings_for(sqlite_store).data_dir / lock_file
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path.unlink(missing_ok=True)
    victim = _plant(kind, path, elsewhere)
    refused = children.run_python(
        children.CLI_SCRIPT, "projections", "lag", env=env, timeout=HARNESS_WAIT_S
    )
    flat = "".join(_flat(refused.stderr).split())  # the console wraps long paths mid-word
    if kind == "symlink-to-nothing":
        assert not victim.exists(), "a lock file was created where the link points"
    elif kind in ("symlink-to-a-file", "hard-link"):
        assert victim.read_text() == PRECIOUS, "the file the lock file names was changed"
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    assert "Traceback" not in refused.stderr, refused.stderr
    assert f"refusedthelockfile{path}:itis{''.join(SAID[kind].split())}" in flat, refused.stderr
    assert "nothingwaschanged" in flat, refused.stderr
    # The file removed, as the hint says, the same command runs.
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    else:
        path.unlink()
    again = children.run_python(
        children.CLI_SCRIPT, "projections", "lag", env=env, timeout=HARNESS_WAIT_S
    )
    assert again.returncode == 0, again.stderr


#: A named lock taken in ``argv[1]``'s SQLite database; prints what it ended in (and,
#: while held, what the folder ``argv[2]`` holds).
_NAMED_TAKE = textwrap.dedent(
    """
    import os, sys
    import sqlalchemy as sa
    from uprof.backends.sqlite import SQLITE

    engine = sa.create_engine(f"sqlite:///{sys.argv[1]}")
    try:
        with SQLITE.named_lock(engine, "idempotency-turn-7f3a", wait_s=1) as held:
            print("held", held, "beside", os.listdir(sys.argv[2]))
    except Exception as error:
        print("refused:", type(error).__name__, getattr(error, "diagnostics", str)())
    """
)


@pytest.mark.parametrize("lock_file", ["views.sqlite.open-lock", "events.sqlite.schema-lock"])
def test_pi_the_other_lock_files_refuse_a_link_too(
    sqlite_store: Backend, tmp_path: Path, lock_file: str
) -> None:
    """Bug PI, one opener for every lock file. main at 1a68357: the linked file emptied
    (the event log's schema lock) or opened as the open lock."""
    from tests.kernel.conftest import settings_for

    path = settings_for(sqlite_store).data_dir / lock_file
    path.unlink(missing_ok=True)
    victim = _plant("symlink-to-a-file", path, tmp_path)
    refused = children.run_python(
        children.CLI_SCRIPT, "projections", "lag", env=cli_env(sqlite_store), timeout=HARNESS_WAIT_S
    )
    assert victim.read_text() == PRECIOUS
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    flat = "".join(_flat(refused.stderr).split())
    assert f"refusedthelockfile{path}:itisasymboliclink" in flat, refused.stderr


def test_pi_a_named_locks_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    """Bug PI for the named locks' folder. main at 1a68357: the lock's file created,
    held and deleted in whatever folder the link named."""
    database = tmp_path / "views.sqlite"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    Path(f"{database}.locks").symlink_to(elsewhere)
    done = children.run_python(_NAMED_TAKE, str(database), str(elsewhere), timeout=HARNESS_WAIT_S)
    said = _flat(done.stdout)
    assert said.startswith(
        f"refused: LockFileRefusedError refused the lock folder {database}.locks: it is a "
        "symbolic link"
    ), (done.stdout, done.stderr)
    assert list(elsewhere.iterdir()) == []


# ---------------------------------------------------- PJ: named locks beside a greedy holder

#: A process holding a named lock for 50 ms at a time, again and again, counting its
#: rounds in a file, until told to stop (``test_schema_lock_turns``'s holder, for
#: ``named_lock``).
_GREEDY_NAMED_HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import sqlalchemy as sa
    from uprof.backends import backend_for

    url, name, rounds, stop = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
    engine = sa.create_engine(url)
    n = 0
    while not stop.exists():
        with backend_for(engine).named_lock(engine, name, wait_s=60) as held:
            assert held
            n += 1
            rounds.write_text(str(n))
            time.sleep(0.05)
    engine.dispose()
    """
)


@pytest.mark.parametrize("name", ["idempotency-turn-7f3a", "apikey-revocation"])
def test_pj_a_named_lock_beside_a_holder_that_takes_it_again_at_once_gets_its_turn(
    backend: Backend, tmp_path: Path, name: str
) -> None:
    """Bug PJ. main at 1a68357: on SQLite the waiter saw hundreds of the holder's rounds
    go by (an idempotent resend past its in-progress wait, a revocation going on without
    its lock); PostgreSQL's named locks queue (held)."""
    from uprof.backends import backend_for

    url = _url(backend, tmp_path)
    rounds, stop = tmp_path / "rounds", tmp_path / "stop"
    engine = sa.create_engine(url)
    # Taken once alone first: PostgreSQL's lock session is then open and kept for reuse,
    # so the rounds counted are the wait's, not a new connection's (seen: 4 on a loaded
    # machine, where the queue itself costs at most the round in progress).
    with backend_for(engine).named_lock(engine, name, wait_s=60) as held:
        assert held
    holder = children.PythonChild(_GREEDY_NAMED_HOLDER, url, name, str(rounds), str(stop))
    seen: list[int] = []
    try:
        _until("the holder loops", lambda: _rounds(rounds) >= 2 or holder.poll() is not None)
        assert holder.poll() is None, holder.communicate()[1][-3000:]
        for _ in range(3):
            asked = _rounds(rounds)
            with backend_for(engine).named_lock(engine, name, wait_s=60) as held:
                assert held
                seen.append(_rounds(rounds) - asked)
            time.sleep(0.01)
    finally:
        stop.touch()
        _, err = holder.communicate(timeout=HARNESS_WAIT_S)
        engine.dispose()
    assert holder.returncode == 0, err[-3000:]
    print(f"rounds of the holder waited per take: {seen}")  # for the record (-rP)
    assert max(seen) <= MOST_ROUNDS_WAITED, f"rounds of the holder waited per take: {seen}"


# ------------------------------------------------ PK: a waiter stopped holding the turnstile

#: Takes the schema lock of ``argv[1]``'s SQLite database within ``argv[2]`` s; with a
#: third argument, says so in ``<that file>.took`` and holds it until that file exists.
#: Prints "took" or the error.
_TAKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import sqlalchemy as sa
    from uprof.storage import schema_lock

    engine = sa.create_engine(f"sqlite:///{sys.argv[1]}")
    try:
        with schema_lock(engine, wait_s=float(sys.argv[2]), purpose="a test's take"):
            print("took", flush=True)
            if len(sys.argv) > 3:
                Path(sys.argv[3] + ".took").touch()
            while len(sys.argv) > 3 and not Path(sys.argv[3]).exists():
                time.sleep(0.02)
    except Exception as error:
        print("refused:", getattr(error, "diagnostics", lambda: str(error))(), flush=True)
    """
)


def _turnstile_held(database: Path) -> bool:
    """Whether a process holds the schema lock's turnstile (exclusively) now."""
    try:
        fd = os.open(f"{database}.schema-turn", os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class _StoppedInTurn:
    """A holder of the schema lock (until ``release``) and a waiter behind it stopped
    (SIGSTOP) while it holds the turnstile; every child killed at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.database = tmp_path / "turns.sqlite"
        self.release_file = tmp_path / "release"
        self.all: list[children.PythonChild] = []
        self.holder = self.take(60, self.release_file)
        took = tmp_path / "release.took"
        _until("the holder took the lock", took.exists)
        self.waiter = self.take(0)  # 0: no limit
        _until("the waiter holds the turnstile", lambda: _turnstile_held(self.database))
        self.waiter.send_signal(signal.SIGSTOP)
        _until("the waiter is stopped", lambda: _stopped(self.waiter.pid))

    def take(self, wait_s: float, hold_until: Path | None = None) -> children.PythonChild:
        extra = [] if hold_until is None else [str(hold_until)]
        child = children.PythonChild(_TAKER, str(self.database), str(wait_s), *extra)
        self.all.append(child)
        return child

    def release(self) -> None:
        self.release_file.touch()
        out, err = self.holder.communicate(timeout=HARNESS_WAIT_S)
        assert self.holder.returncode == 0 and out.startswith("took"), (out, err)

    def kill_all(self) -> None:
        for child in self.all:
            child.send_signal(signal.SIGKILL)  # a stopped process dies of it too
            child.wait(HARNESS_WAIT_S)


@contextmanager
def _stopped_in_turn(tmp_path: Path) -> Iterator[_StoppedInTurn]:
    made = _StoppedInTurn(tmp_path)
    try:
        yield made
    finally:
        made.kill_all()


def test_pk_a_later_waiter_names_the_stopped_waiter_ahead_of_it(tmp_path: Path) -> None:
    """Bug PK, the report. main at 1a68357: "held by pid <holder>" alone; the operator
    who ends the holder still finds the stopped waiter next."""
    with _stopped_in_turn(tmp_path) as made:
        later = made.take(3)
        out, err = later.communicate(timeout=HARNESS_WAIT_S)
    said = _flat(out)
    assert said.startswith("refused: gave up after waiting 3 s"), (out, err)
    assert f"held by pid {made.holder.pid} " in said, said
    assert f"pid {made.waiter.pid} " in said.split(f"held by pid {made.holder.pid} ")[1], said
    assert "waits its turn ahead of this process" in said, said


def test_pk_a_stopped_waiter_holding_the_turnstile_does_not_keep_later_ones_from_a_free_lock(
    tmp_path: Path,
) -> None:
    """Bug PK, the fix. main at 1a68357: the lock free, a later waiter still waited
    behind the stopped one until its bound, "gave up"; now it takes the lock, and the
    stopped waiter, resumed, takes it after."""
    with _stopped_in_turn(tmp_path) as made:
        made.release()
        later = made.take(20)
        out, err = later.communicate(timeout=HARNESS_WAIT_S)
        assert later.returncode == 0 and out.startswith("took"), (out, err)
        made.waiter.send_signal(signal.SIGCONT)
        out, err = made.waiter.communicate(timeout=HARNESS_WAIT_S)
        assert made.waiter.returncode == 0 and out.startswith("took"), (out, err)


# ------------------------------- PostgreSQL: a wait that lock_timeout ended, yet granted

#: Takes and lets go of an advisory lock as fast as it can, until told to stop.
_FLICKERING_HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import sqlalchemy as sa

    url, key, stop = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        while not stop.exists():
            conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": key})
            conn.commit()
            conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            conn.commit()
    engine.dispose()
    """
)

#: Short waits tried beside the flickering holders.
SHORT_WAITS = 1500


def test_a_postgres_wait_ended_by_its_timeout_as_the_lock_was_granted_says_held(
    backend: Backend, tmp_path: Path
) -> None:
    """0191's blocking take under ``lock_timeout``: when the server grants the lock in the
    moment the timeout fires, it raises 55P03 and keeps the grant (a session lock outlives
    the rollback). main at 1a68357 took that for a failed try: the session held the lock
    unknown to uprof (42 of 888 failed tries in a first count), so a later take and its
    one release left it held on a pooled connection, and every other process (and every
    other connection of this one) waited for it. Counted over many short waits, never
    timed: each wait's answer must be what the server says this session holds."""
    if backend.kind != "postgres":
        pytest.skip("PostgreSQL's advisory locks (SQLite: flock has no timeout)")
    from uprof.backends.postgres import _advisory_key, _poll_advisory

    key = _advisory_key("lock-timeout-race")
    stop = tmp_path / "stop"
    holders = [
        children.PythonChild(_FLICKERING_HOLDER, backend.url, str(key), str(stop)) for _ in range(2)
    ]
    engine = sa.create_engine(backend.url)
    wrong: list[tuple[bool, int]] = []
    try:
        with engine.connect() as conn:
            held_now = sa.text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND pid = pg_backend_pid() AND objsubid = 1 "
                "AND classid::bigint = :high AND objid::bigint = :low"
            )
            split = {"high": (key >> 32) & 0xFFFFFFFF, "low": key & 0xFFFFFFFF}
            for _ in range(SHORT_WAITS):
                took = _poll_advisory(conn, "pg_try_advisory_lock", key, time.monotonic() + 0.002)
                held = int(conn.execute(held_now, split).scalar_one())
                conn.commit()
                if took != (held == 1):
                    wrong.append((took, held))
                conn.execute(sa.text("SELECT pg_advisory_unlock_all()"))
                conn.commit()
    finally:
        stop.touch()
        for holder in holders:
            holder.communicate(timeout=HARNESS_WAIT_S)
        engine.dispose()
    assert [h.returncode for h in holders] == [0, 0]
    assert wrong == [], f"{len(wrong)} waits of {SHORT_WAITS} said other than the server"
