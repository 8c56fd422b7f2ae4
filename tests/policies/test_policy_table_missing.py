"""A new process that finds the policy store's table gone (bug PX; decision 0193's Left).

A process starting on a deployment whose policy table had been dropped or renamed away
(``policies_events`` on PostgreSQL, ``stored_events`` in ``policies.sqlite``) let
eventsourcing create it again, empty, then found the empty stream below its anchor and
refused every check as "damaged ... rows removed, or an older policy store put back" (the
CLI: exit 3, as a denial). The operator was told neither that the table was missing nor
what to do, and the empty table it made stood in the way of putting the old one back
(renaming it back failed: the name was taken). Empty is not "deny": a policy store found
empty with no anchor is seeded from the policy file, so an empty table is only ever
refused because of its anchor.

Now no table is made where the key store holds an anchor of the policy log: the start is
refused, naming the missing table, saying nothing was created and how to put it back,
exit 7 (stored data damaged or missing, not an outage: retrying does not help). Real
processes (the CLI in its own process), on SQLite and PostgreSQL.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlalchemy as sa

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import consent, running, settings_for
from tests.kernel.test_review_0141 import _uprof
from tests.policies.conftest import on_the_policy_table
from tests.policies.test_policy_store import _rename_policy_table
from uprof.services.backup import backup, restore
from uprof.settings import Settings


def _policy_tables(backend: Backend, settings: Settings) -> set[str]:
    """The tables of the policy store (its file on SQLite; ``policies_*`` on PostgreSQL)."""
    if backend.kind == "sqlite":
        conn = sqlite3.connect(settings.data_dir / "policies.sqlite")
        try:
            rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        finally:
            conn.close()
        return {str(r[0]) for r in rows}
    engine = sa.create_engine(backend.url)
    try:
        return {t for t in sa.inspect(engine).get_table_names() if t.startswith("policies_")}
    finally:
        engine.dispose()


def _drop_renamed(backend: Backend, settings: Settings) -> None:
    """Drop the table ``_rename_policy_table`` moved away (the table dropped by hand)."""
    on_the_policy_table(backend, settings, "DROP TABLE {table}_gone")


def test_px_a_start_without_the_policy_table_says_it_is_missing_and_makes_none(
    backend: Backend,
) -> None:
    """PX: on main the command created an empty table and refused as "damaged" (exit 3);
    the table could then not be renamed back. Now exit 7 naming the missing table,
    nothing created, and once it is put back the same commands work."""
    settings = settings_for(backend)
    with running(settings, FakeClock()) as kernel:
        consent(kernel, "alice")  # the policy seeded, and its stream anchored
    events = "stored_events" if backend.kind == "sqlite" else "policies_events"
    _rename_policy_table(backend, settings)
    before = _policy_tables(backend, settings)
    assert events not in before, before
    for command in (("policy", "show"), ("consent", "list", "--subject", "alice")):
        refused = _uprof(settings, *command)
        said = " ".join((refused.stdout + refused.stderr).split())
        assert refused.returncode == 7, (refused.returncode, said)
        assert "Traceback" not in said, said
        assert said.startswith("error: policy store missing"), said
        assert f"table {events}" in said and "nothing was created" in said, said
        assert "hint:" in said and "rename it back" in said and "uprof restore" in said, said
        assert _policy_tables(backend, settings) == before  # nothing made in its place
    _rename_policy_table(backend, settings, back=True)
    shown = _uprof(settings, "policy", "show")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    listed = _uprof(settings, "consent", "list", "--subject", "alice")
    assert listed.returncode == 0 and "app:planner" in listed.stdout, listed.stdout + listed.stderr


def test_a_new_deployment_still_makes_its_policy_tables(backend: Backend) -> None:
    """Held: with no anchor of the policy log (a new deployment) the tables are made and
    the policy seeded from the policy file, as before."""
    settings = settings_for(backend)
    shown = _uprof(settings, "policy", "show")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    tables = _policy_tables(backend, settings)
    if backend.kind == "sqlite":
        assert {"stored_events", "stored_snapshots"} <= tables, tables
    else:
        assert {"policies_events", "policies_snapshots"} <= tables, tables


def test_px_a_restore_puts_the_missing_policy_table_back(backend: Backend, tmp_path: Path) -> None:
    """Held, the hint's other road: with the table dropped, ``uprof restore`` of a backup
    takes the backup's policy (the live store holds none) and every start works again.
    Dropped, not renamed: on PostgreSQL a renamed ``policies_events`` keeps its
    sequence's name, and pg_restore then refuses (nothing changed; decision's Left)."""
    settings = settings_for(backend)
    with running(settings, FakeClock()) as kernel:
        consent(kernel, "alice")
    backup(settings, tmp_path / "bk")
    _rename_policy_table(backend, settings)
    _drop_renamed(backend, settings)
    assert _uprof(settings, "policy", "show").returncode == 7
    restore(settings, tmp_path / "bk")
    shown = _uprof(settings, "policy", "show")
    assert shown.returncode == 0, shown.stdout + shown.stderr


#: One command of each way the CLI reaches its stores (``door()``, its own ``try``
#: around ``door()`` in keyops and serve, a bulk import, the residue audit), for the
#: review of 0198-0200: every one exits 7 with the one error, no traceback.
EVERY_PATH = (
    ("projections", "lag"),
    ("capture", "--subject", "alice", "--app", "planner", "--agent", "g", "--text", "hi"),
    ("erase", "subject", "--subject", "alice"),
    ("apps", "create", "app1"),
    ("apps", "list"),
    ("keys", "rotate"),
    ("audit", "residue", "--term", "x"),
    ("audit", "entries"),
    ("subjects", "list"),
)


def test_held_every_command_meets_a_missing_policy_table_with_exit_7(
    backend: Backend, tmp_path: Path
) -> None:
    """Held (0199's exit 7, attacked command by command; a sweep of every command of
    ``uprof --help`` outside the tree found the same): the start's refusal reaches each
    command through ``fail`` and its ``EXIT_CODES``. ``backup`` too, into a new folder."""
    settings = settings_for(backend)
    with running(settings, FakeClock()) as kernel:
        consent(kernel, "alice")
    _rename_policy_table(backend, settings)
    for command in (*EVERY_PATH, ("backup", "--to", str(tmp_path / "bk"))):
        refused = _uprof(settings, *command)
        said = " ".join((refused.stdout + refused.stderr).split())
        assert refused.returncode == 7, (command, refused.returncode, said)
        assert "Traceback" not in said, (command, said)
        assert said.startswith("error: policy store missing"), (command, said)
