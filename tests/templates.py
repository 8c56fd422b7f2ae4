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
        PolicyApplication(env=policy_store_env(settings)).close()
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
