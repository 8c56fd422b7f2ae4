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
from pathlib import Path

import pytest

from tests import children
from tests.conftest import _create_pg_database, _drop_pg_database, _pg_url

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


def _count_each_command(url: str, key_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPROF_", "OTEL_"))}
    env |= {
        "HF_HUB_OFFLINE": "1",
        "UPROF_EMBEDDER": "hashing",
        "UPROF_DATABASE_URL": url,
        "UPROF_KEY_DIR": str(key_dir),
    }
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
