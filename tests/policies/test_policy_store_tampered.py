"""Stores tampered with under a deployment, met by a new CLI process (review of 0199 and
0201, bugs QG and QH): every command answers with its error line and the code
docs/cli.md's table gives it, never a traceback. Real processes (the CLI in its own).

Bug QG: 0199 gave stored data damaged exit 7, but a policy table *emptied* (rows
removed: the stream below its anchor, "damaged") still exited 3, as refused by the
policy, with the policy's hint "ask the operator": every check is denied with the
damage as the reason, and the CLI exited by the denial. It now exits by what stopped
the check (7 damaged, with the damage's hint; 1 when the store cannot be read).

Bug QH: a SQLite store's file replaced by something that is not a database (a copy gone
wrong, a truncated file) ended every command in the driver's traceback. It is now
stored data damaged (exit 7) naming SQLite's code; a folder in a store's place is the
store not answering (exit 1), as SQLite says it cannot open it.
"""

from __future__ import annotations

import pytest

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import consent, running, settings_for
from tests.kernel.test_lock_turns_review import sqlite_store  # noqa: F401 (a fixture)
from tests.kernel.test_review_0141 import _uprof
from tests.policies.conftest import on_the_policy_table
from uprof.settings import Settings

#: Commands that ask the policy (governance, an app's list) and one that does not.
COMMANDS = (("policy", "show"), ("apps", "list"), ("audit", "entries"))


def _said(settings: Settings, *command: str) -> tuple[int, str]:
    done = _uprof(settings, *command)
    said = " ".join((done.stdout + done.stderr).split())
    assert "Traceback" not in said, (command, said)
    return done.returncode, said


def _deployment(backend: Backend) -> Settings:
    settings = settings_for(backend)
    with running(settings, FakeClock()) as kernel:
        consent(kernel, "alice")  # the policy seeded, and its stream anchored
    return settings


def _empty_policy_table(backend: Backend, settings: Settings) -> None:
    on_the_policy_table(backend, settings, "DELETE FROM {table}")


def test_qg_an_emptied_policy_table_exits_7_as_damage_not_3_as_a_denial(
    backend: Backend,
) -> None:
    """Bug QG. main at f9d71eac: exit 3, hint "the policy in policies/ decides who may
    read what; ask the operator"."""
    settings = _deployment(backend)
    _empty_policy_table(backend, settings)
    for command in COMMANDS:
        code, said = _said(settings, *command)
        assert code == 7, (command, code, said)
        assert "error: policy store damaged (stored_data_damaged)" in said, (command, said)
        assert "Restore it from a backup (uprof restore)" in said, (command, said)
        assert "ask the operator" not in said, (command, said)


@pytest.mark.parametrize("store", ["policies.sqlite", "views.sqlite", "events.sqlite"])
@pytest.mark.parametrize("junk", [b"not a database\n", bytes(8192)], ids=["text", "zeros"])
def test_qh_a_store_that_is_not_a_database_exits_7_with_one_line(
    sqlite_store: Backend,  # noqa: F811 (the fixture)
    store: str,
    junk: bytes,
) -> None:
    """Bug QH (SQLite's files; PostgreSQL: n/a). main at f9d71eac: every command ended
    in ``DatabaseError: file is not a database``, a traceback, exit 1."""
    settings = _deployment(sqlite_store)
    (settings.data_dir / store).write_bytes(junk)
    for command in COMMANDS[:2]:
        code, said = _said(settings, *command)
        assert code == 7, (command, code, said)
        assert said.startswith("error: stored data damaged: a SQLite store"), (command, said)
        assert "SQLITE_NOTADB" in said and "uprof restore" in said, (command, said)


def test_qh_a_folder_in_a_stores_place_is_a_store_not_answering(
    sqlite_store: Backend,  # noqa: F811 (the fixture)
) -> None:
    """Bug QH: SQLite cannot open a folder (``SQLITE_CANTOPEN``, an outage code): exit 1
    with its line. main at f9d71eac: the raw ``sqlite3.OperationalError`` of uprof's own
    connection (the journal's switch) was no outage error, a traceback."""
    settings = _deployment(sqlite_store)
    for name in ("policies.sqlite", "policies.sqlite-wal", "policies.sqlite-shm"):
        (settings.data_dir / name).unlink(missing_ok=True)
    (settings.data_dir / "policies.sqlite").mkdir()
    code, said = _said(settings, "policy", "show")
    assert code == 1, said
    assert said.startswith("error: the database did not answer (OperationalError)"), said


def test_held_the_servers_refuse_to_start_on_a_missing_policy_table(backend: Backend) -> None:
    """Held (0199's PX at the servers' starts, which 0201's sweep left out): ``serve``,
    ``worker`` and ``mcp`` exit 7 with the one error line, before they listen."""
    from tests.policies.test_policy_store import _rename_policy_table

    settings = _deployment(backend)
    _rename_policy_table(backend, settings)
    for command in (("serve", "--port", "0"), ("worker",), ("mcp",)):
        code, said = _said(settings, *command)
        assert code == 7, (command, code, said)
        assert said.startswith("error: policy store missing"), (command, said)
