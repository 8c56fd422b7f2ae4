"""A CLI command's start on PostgreSQL asks its checks through the engine its stores then
use (0249-cli-start-cost): the deployment check (0237's bug WM, 0242's XC) and the
check that the database takes writes (0247's XQ) each made an engine and a connection
of their own before the stores made theirs.

Counted in the command's own process (``tests.children.CLI_SCRIPT`` with a listener on
every SQLAlchemy engine's connections): the distinct engines that connected. Not timed
(docs/performance.md has the seconds). The refusals these checks make are the files of
their records (tests/e2e/test_wrong_folder*.py, test_wrong_stores_at_the_start.py,
test_review_0242_database_url.py), kept as they were.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests import children
from tests.conftest import _admin, _create_pg_database, _drop_pg_database, _pg_url

#: The CLI with a count of the engines that opened a connection, said on stderr at exit.
_COUNTED = (
    "import atexit, sys\n"
    "import sqlalchemy as sa\n"
    "seen = []\n"
    "def _connected(conn):\n"
    "    if not any(e is conn.engine for e in seen):\n"
    "        seen.append(conn.engine)\n"
    "sa.event.listen(sa.engine.Engine, 'engine_connect', _connected)\n"
    "atexit.register(lambda: sys.stderr.write(f'\\nENGINES {len(seen)}\\n'))\n"
    + children.CLI_SCRIPT
)


def _engines(env: dict[str, str], *args: str) -> tuple[int, int, str]:
    done = children.run_python(_COUNTED, *args, env=env, timeout=300)
    counts = [line for line in done.stderr.splitlines() if line.startswith("ENGINES ")]
    assert counts, done.stderr[-800:]
    return done.returncode, int(counts[-1].split()[1]), done.stderr


@pytest.mark.postgres  # SQLite's checks look at files: no connection to share
def test_a_commands_start_asks_its_checks_through_the_stores_engine(tmp_path: Path) -> None:
    database = _create_pg_database()
    try:
        _count_each_command(_pg_url(database), tmp_path / "keys")
    finally:
        _drop_pg_database(database)


def _cli_env(url: str, key_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPROF_", "OTEL_"))}
    return env | {
        "HF_HUB_OFFLINE": "1",
        "UPROF_EMBEDDER": "hashing",
        "UPROF_DATABASE_URL": url,
        "UPROF_KEY_DIR": str(key_dir),
    }


def _count_each_command(url: str, key_dir: Path) -> None:
    env = _cli_env(url, key_dir)
    # A creator (the deployment check that refuses only a missing database), then
    # readers (the check that refuses a place holding none), one answered, one refused
    # by the command after the start: one engine each, the stores'.
    for args, exit_code in (
        (["apps", "create", "app:counted"], 0),
        (["apps", "list"], 0),
        (["policy", "show"], 0),
        (["consent", "list", "--subject", "nobody"], 5),
    ):
        code, engines, stderr = _engines(env, *args)
        assert code == exit_code, (args, stderr[-800:])
        assert engines == 1, (args, engines)


def _sessions_ended_on(database: str) -> int:
    """The sessions the server counted on ``database`` (``pg_stat_database.sessions``),
    read once none is connected to it: a backend reports its session before it leaves
    ``pg_stat_activity``. Waits for that with a deadline (a command's sessions end as the
    server notices its process gone)."""
    deadline = time.monotonic() + 30
    with _admin().connect() as conn:
        while True:
            connected = conn.execute(
                sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = :db"),
                {"db": database},
            ).scalar_one()
            if connected == 0:
                return int(
                    conn.execute(
                        sa.text("SELECT sessions FROM pg_stat_database WHERE datname = :db"),
                        {"db": database},
                    ).scalar_one()
                )
            assert time.monotonic() < deadline, f"{connected} session(s) still on {database}"
            time.sleep(0.05)


@pytest.mark.postgres  # SQLite opens files, not server sessions
def test_a_commands_start_opens_five_server_sessions(tmp_path: Path) -> None:
    """A command on an existing deployment: the open hold's session, one for the
    schema lock and the reads and writes of the start and the command (its reads under
    the lock go through the lock's session), and one per event log (the profiles log's
    and the policy store's pools, which open a connection when one is first asked for).
    It opened 8: the pools opened their minimum (2, 1) at once and grew by one more
    each for their first caller, and the revisions and table checks under each schema
    lock took a second pooled session beside the lock's (0253-postgres-case-cost).
    A start holds its turn at the schema lock from the views' upgrade to the erasure
    ledger's read of the views (0256-start-lock-turns), and the wiring's writes in it
    (the partitioning's claim, the projection positions) take one pooled session beside
    the lock's: one more, as a first start's migration (``apps create`` here) does."""
    database = _create_pg_database()
    try:
        env = _cli_env(_pg_url(database), tmp_path / "keys")
        counted: dict[str, int] = {}
        before = _sessions_ended_on(database)
        for args, exit_code in (
            (["apps", "create", "app:counted"], 0),
            (["apps", "list"], 0),
            (["policy", "show"], 0),
            (["consent", "list", "--subject", "nobody"], 5),
        ):
            done = children.run_python(children.CLI_SCRIPT, *args, env=env, timeout=300)
            assert done.returncode == exit_code, (args, done.stderr[-800:])
            after = _sessions_ended_on(database)
            counted[" ".join(args)] = after - before
            before = after
    finally:
        _drop_pg_database(database)
    assert counted == {
        "apps create app:counted": 5,
        "apps list": 5,
        "policy show": 5,
        "consent list --subject nobody": 5,
    }, counted
