"""Storage wiring: engines, eventsourcing settings and migrations, for SQLite or PostgreSQL.

Embedded (no database URL): SQLite files in the data folder —
``events.sqlite`` (the eventsourcing log), ``views.sqlite`` (read models and
audit log) and ``policies.sqlite`` (the policy store, ``policy_store_env``) — and
``keys.sqlite`` (wrapped data keys, subject index, API keys) in the key folder,
apart from the data (decision 0012).
PostgreSQL: one database for all of them; eventsourcing names its tables after
the application (``profiles_events``, ``policies_events``), alembic owns the rest.
The key material that unwraps the key tables stays in the key folder.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from uprof.settings import Settings

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
#: Present in the data folder while ``uprof restore`` runs; a start refuses beside it.
RESTORE_MARKER = "RESTORE-IN-PROGRESS.json"


@dataclass(frozen=True)
class StorageLayout:
    """Where each store lives for one deployment."""

    views_url: str
    keys_url: str
    events_url: str  # the same store eventsourcing writes, for snapshot purges and scans
    eventsourcing_env: dict[str, str]
    events_path: Path | None  # the SQLite event file, for residue scans


def layout_for(settings: Settings) -> StorageLayout:
    if settings.database_url is None:
        data = settings.data_dir
        data.mkdir(parents=True, exist_ok=True)
        keys = settings.key_path
        keys.mkdir(mode=0o700, parents=True, exist_ok=True)
        events = data / "events.sqlite"
        return StorageLayout(
            views_url=f"sqlite:///{data / 'views.sqlite'}",
            keys_url=f"sqlite:///{keys / 'keys.sqlite'}",
            events_url=f"sqlite:///{events}",
            eventsourcing_env={
                "PERSISTENCE_MODULE": "eventsourcing.sqlite",
                "SQLITE_DBNAME": str(events),
                "SQLITE_LOCK_TIMEOUT": "30",
            },
            events_path=events,
        )
    url = sa.engine.make_url(settings.database_url)
    return StorageLayout(
        views_url=settings.database_url,
        keys_url=settings.database_url,
        events_url=settings.database_url,
        eventsourcing_env={
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": url.database or "postgres",
            "POSTGRES_HOST": url.host or "127.0.0.1",
            "POSTGRES_PORT": str(url.port or 5432),
            "POSTGRES_USER": url.username or "postgres",
            "POSTGRES_PASSWORD": url.password or "",
            "POSTGRES_POOL_SIZE": "5",
            "POSTGRES_MAX_OVERFLOW": "10",
        },
        events_path=None,
    )


#: The SQLite file of the policy store (its own application, so its own file: FIELD-NOTES 2.2).
POLICY_STORE_FILE = "policies.sqlite"


def policy_store_env(settings: Settings) -> dict[str, str]:
    """Return the eventsourcing settings of the policy store (``PolicyApplication``).

    SQLite: ``policies.sqlite`` beside the other stores. PostgreSQL: the same database as
    the profiles log, in tables of its own (``policies_events``, ``policies_snapshots``),
    named by eventsourcing after the application.
    """
    if settings.database_url is None:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        return {
            "PERSISTENCE_MODULE": "eventsourcing.sqlite",
            "SQLITE_DBNAME": str(settings.data_dir / POLICY_STORE_FILE),
            "SQLITE_LOCK_TIMEOUT": "30",
        }
    env = dict(layout_for(settings).eventsourcing_env)
    # Few connections: one decision-time version check and the rare change.
    env.update({"POSTGRES_POOL_SIZE": "2", "POSTGRES_MAX_OVERFLOW": "4"})
    return env


def _sqlite_pragmas(dbapi_connection: Any, _record: Any, *, synchronous: str = "NORMAL") -> None:
    cursor = dbapi_connection.cursor()
    # Deleted rows must not linger in free pages (FIELD-NOTES §4); never rely on the
    # build default. WAL lets readers run beside the projection writer.
    cursor.execute("PRAGMA secure_delete=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA synchronous={synchronous}")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _sqlite_pragmas_full(dbapi_connection: Any, record: Any) -> None:
    _sqlite_pragmas(dbapi_connection, record, synchronous="FULL")


def create_engine(url: str, *, fsync_each_commit: bool = False) -> sa.Engine:
    """Build an engine with the settings uprof relies on for this backend.

    ``hide_parameters``: a database error's message (which reaches logs and
    tracebacks) never quotes the statement's values.
    ``fsync_each_commit`` (SQLite): ``synchronous=FULL``, a commit survives a power cut,
    not only a process crash. The key store needs it: the event log (eventsourcing's
    connections) already commits FULL, and after a power cut an event whose capture key
    was lost could never be read again (decision 0017). Other stores keep NORMAL.
    """
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"timeout": 30}, hide_parameters=True)
        pragmas = _sqlite_pragmas_full if fsync_each_commit else _sqlite_pragmas
        sa.event.listen(engine, "connect", pragmas)
        return engine
    return sa.create_engine(
        url, pool_pre_ping=True, pool_size=5, max_overflow=10, hide_parameters=True
    )


#: Advisory lock key that processes starting on one PostgreSQL database queue on.
SCHEMA_LOCK_KEY = 0x7570726F66  # "uprof"


@contextlib.contextmanager
def schema_lock(engine: sa.Engine) -> Iterator[None]:
    """Let one starting process at a time create or migrate tables (PostgreSQL).

    Two processes creating eventsourcing's tables at the same moment crash one of them
    in PostgreSQL's catalog ("tuple concurrently updated"); an advisory lock held on
    its own connection orders them. SQLite serialises schema changes by itself.
    """
    if engine.dialect.name != "postgresql":
        yield
        return
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
        conn.commit()
        try:
            yield
        finally:
            conn.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": SCHEMA_LOCK_KEY})
            conn.commit()


def migrate(engine: sa.Engine, branch: str) -> None:
    """Bring one store's tables to the newest revision of its alembic branch.

    A store already at the branch head is left alone without importing alembic or
    running the migration environment (which imports every table module): every CLI
    command opens two stores, and alembic's import alone is ~0.15-0.25 s of a command
    that has nothing to migrate (decision 0035-observability).
    """
    head = branch_head(branch)
    if head is not None and head in _current_revisions(engine):
        return
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["branch"] = branch
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, f"{branch}@head")


_HEADER = re.compile(
    r'^(revision|down_revision|branch_labels)\s*(?::[^=]*)?=\s*(None|"[^"]*"|\("[^"]*",?\))\s*$',
    re.MULTILINE,
)


def branch_head(branch: str) -> str | None:
    """The newest revision of a migration branch, read from the revision files' headers.

    None whenever the files say something this plain reading does not follow (a merge, a
    second child, a header written another way): ``migrate`` then asks alembic, which
    reads them properly. So a misreading can cost time, never a skipped migration;
    tests/kernel/test_migrations_head.py checks the reading against alembic's.
    """
    parent: dict[str, str | None] = {}
    root = None
    for path in sorted((MIGRATIONS_DIR / "versions").glob("*.py")):
        fields = dict(_HEADER.findall(path.read_text("utf-8")))
        if "revision" not in fields or "down_revision" not in fields:
            return None
        revision = fields["revision"].strip('"')
        down = fields["down_revision"]
        parent[revision] = None if down == "None" else down.strip('"')
        if f'"{branch}"' in fields.get("branch_labels", ""):
            root = revision
    children: dict[str | None, list[str]] = {}
    for revision, down in parent.items():
        children.setdefault(down, []).append(revision)
    head = root
    while head is not None and head in children:
        if len(children[head]) != 1:
            return None
        head = children[head][0]
    return head


def _current_revisions(engine: sa.Engine) -> set[str]:
    """The revisions recorded in the store's ``alembic_version`` table (none: a new store)."""
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table("alembic_version"):
            return set()
        rows = conn.execute(sa.text("SELECT version_num FROM alembic_version"))
        return {row[0] for row in rows}


#: Where eventsourcing keeps the profiles log: in SQLite the log's own file holds one
#: application, under the library's default name; PostgreSQL shares one database
#: between applications and names the table after the application ("profiles").
EVENTS_TABLES = {"sqlite": "stored_events", "postgresql": "profiles_events"}


def log_holds_events(engine: sa.Engine) -> bool:
    """Whether the event log already holds any event (read through the driver).

    Asked before a deployment creates new key material: keys are only ever new for a
    new log. The engine is the deployment's own (pooled, kept open): a probe connection
    closed here would drop this process's SQLite locks (FIELD-NOTES 8.1).
    """
    name = EVENTS_TABLES[engine.dialect.name]
    inspector = sa.inspect(engine)
    schemas = [None] if engine.dialect.name == "sqlite" else inspector.get_schema_names()
    with engine.connect() as conn:
        for schema in schemas:
            if not inspector.has_table(name, schema=schema):
                continue
            table = sa.table(name, schema=schema)
            if conn.execute(sa.select(sa.literal(1)).select_from(table).limit(1)).first():
                return True
    return False


def sqlite_checkpoint(engine: sa.Engine) -> None:
    """Fold the WAL into the main file and truncate it (shredded bytes must not linger)."""
    if engine.dialect.name != "sqlite":
        return
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
