"""Review of 0180 and 0183: what ends a start waiting for the schema lock, and lock files
a start cannot open. Real processes, as an operator runs them.

- Bug OA: a CLI command, ``uprof mcp`` or ``uprof serve`` sent SIGTERM while it waited
  for the schema lock died of the signal's default without a word (a supervisor's log
  said nothing of why the start ended); SIGINT (Ctrl-C) raised ``KeyboardInterrupt``
  wherever the wait was. 0183 made only ``uprof worker`` stop cleanly. Now every one
  of them ends the wait, says "stopped before it started ... nothing was changed",
  and exits as a shell reports the signal (128 + its number; the servers 0, as after
  the signal once serving).
- Bug OE: ``uprof mcp`` opened the API key store before its start, and opening it
  upgrades the key store's schema, outside the schema lock: behind a stopped upgrade
  it upgraded the key store beside the holder's upgrade, and a stop in its wait then
  left the store changed.
- Bug OB: a SQLite lock file this process's user cannot open (another user's, mode
  0000) failed every start with ``PermissionError``'s traceback (0180 "Left"). Now an
  error names the file, its owner and mode, and what to do. The tests run as root, who
  opens any file: the child drops ``CAP_DAC_OVERRIDE`` first, as an unprivileged user
  has none.

The harness waits for each child at most ``HARNESS_WAIT_S``; nothing here asserts how
long anything took.
"""

from __future__ import annotations

import signal
import textwrap
from pathlib import Path

import pytest

from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, cli_env, settings_for
from tests.kernel.test_schema_lock_wait import (
    HARNESS_WAIT_S,
    _flat,
    _Starts,
    _until,
    _waiting,
    starts,  # noqa: F401 (the fixture)
)
from tests.kernel.test_upgrade_processes import assert_upgraded_and_intact, previous_schema_store

#: ``uprof <args>``, leaving a mark for each store it upgrades: ``views-<pid>`` at the
#: views' first new table, ``keys-<pid>`` at the key store's.
_MARKING = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import sqlalchemy as sa

    # Ctrl-C as in a terminal (a child of the tests' fork server may inherit it ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    out = Path(sys.argv[1])
    MARKS = {
        "CREATE TABLE rate_limit_slots": "views",
        "CREATE TABLE destroyed_capture_keys": "keys",
    }

    @sa.event.listens_for(sa.Engine, "after_cursor_execute")
    def _inside(conn, cursor, statement, *rest):
        flat = " ".join(statement.split())
        for table, store in MARKS.items():
            if table in flat:
                (out / f"{store}-{os.getpid()}").touch()

    sys.argv = ["uprof", *sys.argv[2:]]
    from uprof.cli.main import app
    app()
    """
)

COMMANDS = {
    "cli": ("projections", "lag"),
    "mcp": ("mcp", "--transport", "http", "--port", "0"),
    "serve": ("serve", "--port", "0"),
}


def _behind(made: _Starts, command: tuple[str, ...], wait_s: float) -> children.PythonChild:
    env = cli_env(made.backend)
    env["UPROF_SCHEMA_LOCK_WAIT_S"] = str(wait_s)
    child = children.PythonChild(_MARKING, str(made.out), *command, env=env)
    made.all.append(child)
    return child


def _upgraded_by(out: Path, pid: int) -> list[str]:
    return sorted(store for store in ("views", "keys") if (out / f"{store}-{pid}").exists())


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_oa_a_start_waiting_for_the_schema_lock_stops_on_a_signal_and_says_so(
    backend: Backend,
    clock: FakeClock,
    starts: _Starts,  # noqa: F811
    command: str,
    signum: int,
) -> None:
    """Bug OA (and OE for ``mcp``): stopped while it waits, a start ends at once, says
    so, changes nothing; the holder, resumed, finishes the upgrade alone."""
    settings = previous_schema_store(backend, clock)
    holder = starts.stopped_holder()
    behind = _behind(starts, COMMANDS[command], wait_s=0)  # 0: it would wait for ever
    _until("the start behind says it waits", lambda: _waiting(behind))
    behind.send_signal(signum)
    try:
        stdout, stderr = behind.communicate(timeout=HARNESS_WAIT_S)
    except Exception:
        pytest.fail(f"still waiting after the signal: {behind.stderr_so_far()!r}")
    flat = _flat(stderr)
    name = signal.Signals(signum).name
    # main at 5e738d2: SIGTERM killed it (-15), nothing said; SIGINT: "Aborted!" or a
    # traceback of KeyboardInterrupt. A one-shot command exits as a shell reports the
    # signal (it did not do its work); a server exits 0, as after the signal once serving.
    if command == "cli":
        assert behind.returncode == 128 + signum, (behind.returncode, stdout, stderr)
        said = "uprof stopped before it started"
    else:
        assert behind.returncode == 0, (behind.returncode, stdout, stderr)
        said = f"uprof {command} stopped before it started"
    assert f"{said}: asked to stop by {name} while waiting" in flat, stderr
    assert "for the schema lock of" in flat and "nothing was changed" in flat, stderr
    assert "Traceback" not in stderr and "Aborted" not in stderr, stderr
    assert "ready" not in stdout and "Uvicorn running" not in stderr
    assert _upgraded_by(starts.out, behind.pid) == [], "the stopped start changed a store"
    holder.send_signal(signal.SIGCONT)
    holder.communicate(timeout=HARNESS_WAIT_S)
    assert holder.returncode == 0
    assert_upgraded_and_intact(settings, clock)


def test_oe_mcp_does_not_upgrade_the_key_store_outside_the_schema_lock(
    backend: Backend,
    clock: FakeClock,
    starts: _Starts,  # noqa: F811
) -> None:
    """Bug OE: behind a stopped upgrade (inside the views' part, the key store next),
    ``uprof mcp`` upgraded the key store itself before it waited for the lock, beside
    the holder's upgrade of the same stores; giving up its wait, it had changed them."""
    previous_schema_store(backend, clock)
    holder = starts.stopped_holder()
    behind = _behind(starts, COMMANDS["mcp"], wait_s=2)
    stdout, stderr = behind.communicate(timeout=HARNESS_WAIT_S)
    assert behind.returncode == 1, (stdout, stderr)
    assert "gave up after waiting 2 s" in _flat(stderr), stderr
    # main at 5e738d2: ["keys"], the key store upgraded outside the lock.
    assert _upgraded_by(starts.out, behind.pid) == []
    holder.kill()
    holder.wait(HARNESS_WAIT_S)


# ------------------------------------------------- lock files this user cannot open

#: ``uprof projections lag`` in a process without ``CAP_DAC_OVERRIDE`` and
#: ``CAP_DAC_READ_SEARCH`` (root keeps its uid, and its own files' owner rights): file
#: modes bind it as they bind any user.
_WITHOUT_DAC_OVERRIDE = textwrap.dedent(
    """
    import ctypes, os, sys

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]

    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
        assert libc.capget(ctypes.byref(header), data) == 0, ctypes.get_errno()
        data[0].effective &= ~((1 << 1) | (1 << 2))  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        assert libc.capset(ctypes.byref(header), data) == 0, ctypes.get_errno()
    sys.argv = ["uprof", *sys.argv[1:]]
    from uprof.cli.main import app
    app()
    """
)

LOCK_FILES = ["views.sqlite.open-lock", "views.sqlite.schema-lock", "events.sqlite.schema-lock"]


@pytest.mark.parametrize("lock_file", LOCK_FILES)
def test_ob_a_lock_file_this_user_cannot_open_is_named_with_what_to_do(
    tmp_path: Path, clock: FakeClock, lock_file: str
) -> None:
    """Bug OB (SQLite: its locks are files in the data folder; PostgreSQL's are the
    server's). main at 5e738d2: ``PermissionError`` and its traceback."""
    backend = Backend("sqlite", "", tmp_path)
    settings = settings_for(backend)
    build_kernel(settings, clock).close()
    path = settings.data_dir / lock_file
    assert path.exists()
    path.chmod(0)
    try:
        refused = children.run_python(
            _WITHOUT_DAC_OVERRIDE, "projections", "lag", env=cli_env(backend), timeout=120
        )
    finally:
        path.chmod(0o600)
    flat = _flat(refused.stderr)
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    assert "Traceback" not in refused.stderr, refused.stderr
    # The console wraps long paths mid-word: compared without any white space.
    assert f"cannotopenthelockfile{path}(Permissiondenied" in "".join(flat.split()), flat
    assert "mode 0000" in flat and "this process runs as uid" in flat, flat
    assert "run uprof as the user that owns the data folder" in flat, flat
    assert "nothing was changed" in flat, flat
    # Its mode put back, the same command runs.
    again = children.run_python(
        _WITHOUT_DAC_OVERRIDE, "projections", "lag", env=cli_env(backend), timeout=120
    )
    assert again.returncode == 0, again.stderr


def test_ob_a_named_lock_folder_this_user_cannot_write_is_named(tmp_path: Path) -> None:
    """Bug OB for the deployment's named locks (idempotent requests' turns, erasures): a
    ``<database>.locks`` folder of another user's, unwritable, in a child without
    ``CAP_DAC_OVERRIDE``: the error names the folder, not a traceback."""
    script = textwrap.dedent(
        """
        import sys
        import sqlalchemy as sa
        from uprof.backends.sqlite import SQLITE
        engine = sa.create_engine(f"sqlite:///{sys.argv[1]}")
        try:
            with SQLITE.named_lock(engine, "turn", wait_s=1) as held:
                print("held", held)
        except Exception as error:  # main at 5e738d2: PermissionError
            said = getattr(error, "diagnostics", lambda: str(error))()
            print("refused:", type(error).__name__, said)
        """
    )
    header = _WITHOUT_DAC_OVERRIDE.split("sys.argv = ")[0]
    database = tmp_path / "views.sqlite"
    folder = tmp_path / "views.sqlite.locks"
    folder.mkdir(mode=0o500)
    try:
        done = children.run_python(header + script, str(database), timeout=120)
    finally:
        folder.chmod(0o700)
    assert done.returncode == 0, done.stderr
    flat = _flat(done.stdout)
    assert flat.startswith(f"refused: LockFileAccessError cannot open the lock file {folder}/"), (
        flat
    )
    assert "mode 0500" in flat and "run uprof as the user that owns" in flat, flat
