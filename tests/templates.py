"""Schema templates: what the ``backend`` fixture copies so a test's store starts migrated.

A first start on an empty store spends most of its time on DDL: alembic's three branches
and the tables eventsourcing creates (0.25-0.3 s on PostgreSQL, 0.07-0.09 s on SQLite,
against ~0.06 s and ~0.01 s on a store already at head). A template is built once per test
session (per xdist worker) by the same calls a first start makes, and copied per test:
``CREATE DATABASE ... TEMPLATE`` on PostgreSQL, the files on SQLite. Each test still owns a
store of its own (decision 0043-test-suite-speed).

Only schema is in a template: the schema version rows (alembic's, and the one eventsourcing
writes in a tracking table it creates) and nothing else. No key material
(each test's key folder gets its own at first start), no policy seed, no partition claim,
no audit entry; ``check_holds_only_schema`` proves it for each template built, and
tests/kernel/test_store_templates.py proves a template's schema is what a first start
on an empty store creates.
"""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from tests.fakes.ports import InMemoryKeyMaterialStore
from uprof.crypto.keystore import KekRing, KeyStore
from uprof.eventstore import ProfilesApplication
from uprof.services.policy import PolicyApplication
from uprof.settings import Settings
from uprof.storage import layout_for, migrate, open_engines, policy_store_env

#: The one table a template may hold rows in (the revisions its schema is at).
VERSION_TABLE = "alembic_version"
#: eventsourcing's own schema version: a row its tracking tables get when it creates them.
TRACKING_FORMAT_ROW = "__migration__"
#: The data folder inside a SQLite template's folder (and inside a test's ``tmp_path``):
#: the ``data_dir`` the test fixtures' Settings use; the key folder is its ``.keys`` twin.
SQLITE_DATA = "data"


def create_schema(settings: Settings) -> None:
    """Create every table a first start of ``bootstrap`` creates, and write no row.

    The same calls as ``uprof.bootstrap.bootstrap``, minus what writes rows there: the
    partition claim, the policy seed and its audit entry, the key material (a throwaway
    in-memory one here, never written: no subject is created).
    """
    layout = layout_for(settings)
    stores = open_engines(layout)
    views, keys, events = stores.views, stores.keys, stores.events
    try:
        migrate(views, "views")
        migrate(keys, "keys")
        keystore = KeyStore(
            keys,
            master_secret=secrets.token_bytes(32),
            kek_ring=KekRing(InMemoryKeyMaterialStore()),
        )
        ProfilesApplication(
            env=layout.eventsourcing_env, keystore=keystore, events_engine=events
        ).close()
        PolicyApplication(env=policy_store_env(settings), keystore=keystore).close()
    finally:
        stores.dispose()


def check_holds_only_schema(url: str) -> None:
    """Raise AssertionError if a table of the database at ``url`` holds a row other than
    a schema version (alembic's, or eventsourcing's in its tracking tables)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            inspector = sa.inspect(conn)
            for table in inspector.get_table_names():
                if table == VERSION_TABLE:
                    continue
                query = f'SELECT count(*) FROM "{table}"'
                if "application_name" in {c["name"] for c in inspector.get_columns(table)}:
                    query += f" WHERE application_name <> '{TRACKING_FORMAT_ROW}'"
                rows = conn.execute(sa.text(query)).scalar_one()
                assert rows == 0, f"the schema template holds {rows} row(s) in {table}"
    finally:
        engine.dispose()


class SqliteTemplate:
    """The store files of a first start, built once in ``root``, copied into test folders."""

    def __init__(self, root: Path) -> None:
        self.root = root
        settings = Settings(data_dir=root / SQLITE_DATA, embedder="hashing")
        create_schema(settings)
        # Every connection is closed: each file is whole (no -wal beside it to copy).
        self.files = sorted(p.relative_to(root) for p in root.rglob("*.sqlite"))
        assert not list(root.rglob("*.sqlite-wal")), "a template connection is still open"
        for name in self.files:
            check_holds_only_schema(f"sqlite:///{root / name}")

    def copy_into(self, folder: Path) -> None:
        """Put the store files in ``folder`` (its ``data`` and ``data.keys``), modes kept."""
        for name in self.files:
            target = folder / name
            if not target.parent.exists():
                target.parent.mkdir(parents=True)
                shutil.copymode(self.root / name.parent, target.parent)
            shutil.copy(self.root / name, target)


def relax_commit_flush(conn: sa.Connection, dbname: str) -> None:
    """Sessions on ``dbname`` commit without waiting for the WAL flush to disk.

    ``synchronous_commit = off`` for that database (the setting stays with it when it is
    renamed): a commit returns once written to PostgreSQL's WAL buffers, and is visible
    to every other session at once, as with ``on``; only a crash of the PostgreSQL server
    itself (never part of a test: tests kill uprof processes, not the database) could
    lose the last ~0.6 s of commits. A ``CHECKPOINT`` still flushes the whole WAL first.
    """
    conn.execute(sa.text(f'ALTER DATABASE "{dbname}" SET synchronous_commit = off'))


def wait_until_unused(admin: sa.Engine, dbname: str, timeout_s: float = 10.0) -> None:
    """Wait until no session is connected to ``dbname``: ``CREATE DATABASE ... TEMPLATE``
    refuses a template with any session on it."""
    deadline = time.monotonic() + timeout_s
    with admin.connect() as conn:
        while True:
            sessions = conn.execute(
                sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = :name"),
                {"name": dbname},
            ).scalar_one()
            if sessions == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{sessions} session(s) still on the template {dbname}")
            time.sleep(0.05)


#: What a PostgreSQL schema is made of, as its catalog states it.
PG_SCHEMA = {
    "columns": "SELECT table_name, column_name, data_type, is_nullable, column_default "
    "FROM information_schema.columns WHERE table_schema = 'public'",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'",
    "constraints": "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) "
    "FROM pg_constraint WHERE connamespace = 'public'::regnamespace",
    "triggers": "SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) "
    "FROM pg_trigger WHERE NOT tgisinternal",
    "functions": "SELECT proname, prosrc FROM pg_proc WHERE pronamespace = 'public'::regnamespace",
    "schemas": "SELECT nspname FROM pg_namespace "
    "WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'",
    "extensions": "SELECT extname, extversion FROM pg_extension",
}
#: Where each sequence stands (part of a store's state: a reused store restores them).
PG_SEQUENCES = (
    "SELECT schemaname, sequencename, start_value, last_value FROM pg_sequences "
    "WHERE schemaname = 'public'"
)


def pg_schema(conn: sa.Connection) -> dict[str, list[tuple[object, ...]]]:
    """The schema of the database ``conn`` is on, part by part, each sorted."""
    return {part: sorted(map(tuple, conn.execute(sa.text(sql)))) for part, sql in PG_SCHEMA.items()}


def _pg_sequences(conn: sa.Connection) -> list[tuple[object, ...]]:
    return sorted(tuple(r) for r in conn.execute(sa.text(PG_SEQUENCES)))


class PgStores:
    """This process's PostgreSQL stores: copies of the schema template, reused once reset.

    Copying the template costs the server ~0.14 s of CPU per store (``CREATE DATABASE``
    writes every page of it, system catalogs included, to the WAL; ``DROP`` removes the
    files), and a run of the suite takes ~470 stores. A store a test gives back is
    instead brought back to the template's state and handed out again:

    - every other session on it is terminated (as ``DROP ... WITH (FORCE)`` would);
    - every row is deleted but the schema versions the template holds, with triggers
      off for the deletion (the audit tables refuse it otherwise), and every sequence is
      set back to where the template's stands, in one transaction;
    - its schema is compared with the template's: a store whose schema a test changed is
      dropped, never handed out;
    - it is renamed, so a URL an earlier test handed to a process it left behind reaches
      nothing (as after a drop) instead of the next test's store.

    tests/kernel/test_store_templates.py proves a reset store holds what a fresh copy
    holds, and that a store with an altered schema is not reused.
    """

    def __init__(self, admin: sa.Engine, template: str, url_of: Callable[[str], str]) -> None:
        self._admin = admin
        self.template = template
        self._url_of = url_of
        self._spare: list[str] = []
        engine = sa.create_engine(url_of(template), poolclass=sa.pool.NullPool)
        try:
            with engine.connect() as conn:
                self.schema = pg_schema(conn)
                self.sequences = _pg_sequences(conn)
                inspector = sa.inspect(conn)
                self._tables = {
                    table: "application_name" in {c["name"] for c in inspector.get_columns(table)}
                    for table in inspector.get_table_names()
                    if table != VERSION_TABLE
                }
        finally:
            engine.dispose()
        self._reset_sql = _reset_statements(self._tables, self.sequences)
        #: How many stores were reset and handed out again, and how many were dropped.
        self.reused = 0
        self.dropped = 0

    def take(self) -> str:
        """The name of a store of the template's state for one test."""
        if self._spare:
            self.reused += 1
            return self._spare.pop()
        name = _new_name("uprof_test")
        with self._admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"'))
            relax_commit_flush(conn, name)
        return name

    def give_back(self, name: str) -> None:
        """Reset the store ``name`` for another test, or drop it if that fails."""
        try:
            self._spare.append(self._reset(name))
        except Exception:
            self.dropped += 1
            self.drop(name)

    def drop(self, name: str) -> None:
        with self._admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def close(self) -> None:
        while self._spare:
            self.drop(self._spare.pop())

    def _reset(self, name: str) -> str:
        self._end_sessions(name)
        engine = sa.create_engine(self._url_of(name), poolclass=sa.pool.NullPool)
        try:
            # One session for the reset and the check: a new one would cost the server a
            # backend and its catalog caches again (~5 ms of its CPU per test: 26.5 -> 21.5).
            with engine.connect() as conn:
                with conn.begin():
                    # The same statements, sent as one (no parameters: libpq's simple
                    # query protocol runs them in order, in this transaction): one round
                    # trip where there were ~40.
                    conn.exec_driver_sql(self._reset_sql)
                if pg_schema(conn) != self.schema or _pg_sequences(conn) != self.sequences:
                    raise AssertionError(f"{name} no longer has the template's schema")
        finally:
            engine.dispose()
        renamed = _new_name("uprof_test")
        wait_until_unused(self._admin, name)
        with self._admin.connect() as conn:
            conn.execute(sa.text(f'ALTER DATABASE "{name}" RENAME TO "{renamed}"'))
        return renamed

    def _end_sessions(self, name: str) -> None:
        with self._admin.connect() as conn:
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )
        wait_until_unused(self._admin, name)


def _reset_statements(tables: dict[str, bool], sequences: list[tuple[object, ...]]) -> str:
    """The statements that bring a store back to the template's rows and sequences:
    triggers off for this transaction (the audit tables refuse deletions otherwise),
    every row deleted but the schema versions (``tables``: name -> whether it is a
    tracking table, which keeps eventsourcing's version row), every sequence set back
    where the template's stands. Names come from the template's catalog; one holding a
    quote is refused rather than written into SQL."""
    statements = ["SET LOCAL session_replication_role = replica"]
    for table, tracking in tables.items():
        assert '"' not in table and "'" not in table, table
        keep = f" WHERE application_name <> '{TRACKING_FORMAT_ROW}'" if tracking else ""
        statements.append(f'DELETE FROM "{table}"{keep}')
    for _, sequence, start, last in sequences:
        assert isinstance(sequence, str) and '"' not in sequence and "'" not in sequence
        value, called = (start, "false") if last is None else (last, "true")
        statements.append(f"""SELECT setval('public."{sequence}"', {int(str(value))}, {called})""")
    return ";\n".join(statements)


def _new_name(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(6)}"
