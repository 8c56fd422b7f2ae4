"""A start killed (SIGKILL) in the middle of switching a new SQLite store file into WAL
mode, or just after the switch and before the file's schema exists (decision
0161-start-locks, ``retry.WAL_SWITCH``): the processes started next on that folder all
come up, every store file is in WAL mode, the schema is whole, no rollback journal or lock
is left that stops anyone, and a deployment then keeps what it is given.

Stopping the victim at the moment is deterministic, with nothing in the product: the
victim (a real process, a start as ``uprof serve`` makes one) runs with
``uprof.backends.sqlite._into_wal`` wrapped by this test's script, which leaves a marker
file as it enters the switch of the chosen file and another as it leaves it; the parent
kills it with SIGKILL on the marker.

- "during": another process holds a read transaction on the new file, so the switch,
  which needs the file's exclusive lock, waits inside SQLite (the busy handler, holding
  the file's write lock) until it is killed: the marker "in" is there, "out" never is.
- "after": the switch committed ("out"), and the victim stops there, before anything is
  created in the file (for ``views.sqlite`` and ``keys.sqlite`` while it holds the
  schema lock of the views store).
"""

from __future__ import annotations

import sqlite3
import textwrap
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel
from tests.kernel.test_concurrent_start import STARTS, starts_at_once
from tests.kernel.test_keys_apart import BOB, assert_bob_intact, fill
from uprof.settings import Settings
from uprof.storage import branch_head

#: Every SQLite file a start switches into WAL mode, in the data folder or the key folder.
STORE_FILES = {
    "events.sqlite": "data",
    "views.sqlite": "data",
    "policies.sqlite": "data",
    "keys.sqlite": "data.keys",
}
#: The alembic branch each uprof-migrated file holds.
BRANCHES = {"views.sqlite": "views", "keys.sqlite": "keys", "events.sqlite": "events"}

_VICTIM = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import uprof.backends.sqlite as sqlite_backend
    from tests.fakes.ports import FakeClock
    from tests.kernel.conftest import build_kernel
    from uprof.settings import Settings

    data_dir, target, moment, marker = sys.argv[1:5]
    real = sqlite_backend._into_wal

    def into_wal(connection):
        name = Path(connection.execute("PRAGMA database_list").fetchall()[0][2]).name
        if name != target or Path(marker + ".in").exists():
            return real(connection)
        Path(marker + ".in").write_text("")
        real(connection)
        Path(marker + ".out").write_text("")
        if moment == "after":
            time.sleep(600)  # killed here, before anything is created in the file

    sqlite_backend._into_wal = into_wal
    build_kernel(Settings(data_dir=Path(data_dir), embedder="hashing"), FakeClock()).close()
    print("started without being stopped", flush=True)
    """
)


def _hold_a_read(database: str, holding: object, release: object) -> None:
    # A reader of the new file (another process starting, a backup): its SHARED lock keeps
    # a switch into WAL, which needs the exclusive lock, waiting inside SQLite.
    connection = sqlite3.connect(database, isolation_level=None)
    try:
        connection.execute("BEGIN")
        connection.execute("SELECT count(*) FROM sqlite_master").fetchall()
        holding.set()  # type: ignore[attr-defined]
        release.wait(120)  # type: ignore[attr-defined]
        connection.execute("COMMIT")
    finally:
        connection.close()


def _wait_for(path: Path, victim: children.PythonChild, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert victim.poll() is None, victim.communicate()
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.01)


def _wait_until_write_locked(
    database: Path, victim: children.PythonChild, timeout_s: float = 120.0
) -> None:
    """Until a read of ``database`` is refused at once: the victim's switch holds the
    file's write lock (its pending lock keeps new readers out) and waits inside SQLite
    for the reader's shared lock to go. The reader only reads, so nobody else holds it."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert victim.poll() is None, victim.communicate()
        # timeout=0: no busy wait, a held pending lock answers "database is locked" at once.
        connection = sqlite3.connect(database, timeout=0, isolation_level=None)
        try:
            connection.execute("BEGIN")
            connection.execute("SELECT count(*) FROM sqlite_master").fetchall()
        except sqlite3.OperationalError as error:
            assert "locked" in str(error), error
            return
        finally:
            connection.close()
        assert time.monotonic() < deadline, "the switch never took the file's write lock"
        time.sleep(0.01)


def _journal_mode(database: Path) -> str:
    # Reading the mode changes nothing (no switch is asked); through the driver only.
    connection = sqlite3.connect(database, timeout=30)
    try:
        return str(connection.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        connection.close()


def _revisions(database: Path) -> set[str]:
    engine = sa.create_engine(f"sqlite:///{database}")
    try:
        with engine.connect() as conn:
            return {r[0] for r in conn.execute(sa.text("SELECT version_num FROM alembic_version"))}
    finally:
        engine.dispose()


def _left_behind(root: Path) -> list[str]:
    """What a killed start could leave that stops or misleads the next: a rollback journal
    (hot or not), a restore's staging file, a named lock file (holders delete theirs)."""
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.name.endswith("-journal")
        or p.name.startswith(".restore-")
        or (p.parent.name.endswith(".locks") and p.is_file())
    )


@pytest.mark.parametrize("moment", ["during", "after"])
@pytest.mark.parametrize("target", list(STORE_FILES))
def test_a_start_killed_switching_a_new_file_into_wal_leaves_a_folder_others_start_on(
    tmp_path: Path, target: str, moment: str
) -> None:
    root = tmp_path
    settings = Settings(data_dir=root / "data", embedder="hashing")
    database = root / STORE_FILES[target] / target
    database.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    marker = root / "marker"
    holding, release = children.CONTEXT.Event(), children.CONTEXT.Event()
    reader = None
    if moment == "during":
        reader = children.CONTEXT.Process(
            target=_hold_a_read, args=(str(database), holding, release)
        )
        reader.start()
        assert holding.wait(60), "the reader did not start its read"
    victim = children.PythonChild(_VICTIM, str(settings.data_dir), target, moment, str(marker))
    try:
        if moment == "during":
            _wait_for(Path(f"{marker}.in"), victim)
            _wait_until_write_locked(database, victim)
            assert not Path(f"{marker}.out").exists(), "the switch did not wait for the reader"
        else:
            _wait_for(Path(f"{marker}.out"), victim)
        victim.kill()
        assert victim.wait(60) == -9
    finally:
        release.set()
        if reader is not None:
            reader.join(60)
        if victim.poll() is None:
            victim.kill()
            victim.wait(60)
    assert not Path(f"{marker}.out").exists() or moment == "after"

    assert starts_at_once(settings.data_dir, Backend("sqlite", "", root)) == ["ok"] * STARTS

    for name, folder in STORE_FILES.items():
        assert _journal_mode(root / folder / name) == "wal", name
    for name, branch in BRANCHES.items():
        assert branch_head(branch) in _revisions(root / STORE_FILES[name] / name), name
    assert _left_behind(root) == []
    # A deployment on the folder keeps what it is given, and its audit log verifies.
    clock = FakeClock()
    kernel = build_kernel(settings, clock)
    try:
        fill(kernel, "bob", BOB)
    finally:
        kernel.close()
    assert_bob_intact(settings, clock, audit_verifies=True)
