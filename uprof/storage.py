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
import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from uprof.backends import (
    StorageLayout,
    backend_for,
    backend_for_settings,
    backend_for_url,
    reading_connection,
)
from uprof.settings import Settings

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
#: Present in the data folder while ``uprof restore`` runs; a start refuses beside it.
RESTORE_MARKER = "RESTORE-IN-PROGRESS.json"
#: The manifest ``uprof backup --to`` writes beside the stores' copies; its ``format``
#: begins with ``BACKUP_FORMAT_PREFIX``. A data folder never holds one.
BACKUP_MANIFEST = "manifest.json"
BACKUP_FORMAT_PREFIX = "uprof-backup/"


def layout_for(settings: Settings) -> StorageLayout:
    """Where each store of the deployment lives (its backend decides)."""
    return backend_for_settings(settings).layout(settings)


def deployment_place(settings: Settings) -> str:
    """Where ``settings`` put a deployment's data, as the user named it: the data folder,
    or the database URL with its password hidden."""
    if settings.database_url is None:
        return f"the data folder {settings.data_dir}"
    return f"the database {shown_url(settings.database_url)}"


#: The URL query parameters that carry a secret (libpq's connection parameters, which
#: psycopg takes from the query string as from before the host).
SECRET_URL_PARAMETERS = frozenset({"password", "sslpassword"})


def shown_url(database_url: str) -> str:
    """``database_url`` as it may be shown (stderr, stdout, logs): its password hidden,
    before the host and in the query string, where libpq takes it too (bug XI)."""
    url = sa.engine.make_url(database_url)
    hidden = {name: "***" for name in url.query if name.lower() in SECRET_URL_PARAMETERS}
    return url.update_query_dict(hidden).render_as_string(hide_password=True)


def refuse_backup_folder(settings: Settings) -> None:
    """Raise ``BackupFolderNamedError`` (exit 8) when the SQLite data folder of
    ``settings`` holds a uprof backup's manifest (or a manifest that cannot be read, as a
    backup's damaged one): a backup's folder named as the data folder. Asked before any
    store is opened: opening rewrites the copies, and the backup no longer matched its
    manifest (bug XK). PostgreSQL's data is in the database, its backup a dump file."""
    from domain.errors import BackupFolderNamedError

    if settings.database_url is not None:
        return
    manifest = settings.data_dir / BACKUP_MANIFEST
    if not manifest.exists():
        return
    try:
        found = json.loads(manifest.read_text(encoding="utf-8")).get("format")
    except (OSError, ValueError, AttributeError):
        found = None  # unreadable: a damaged backup's, as far as anyone can tell
    if isinstance(found, str) and not found.startswith(BACKUP_FORMAT_PREFIX):
        return
    raise BackupFolderNamedError(
        f"the data folder {settings.data_dir} holds a uprof backup ({BACKUP_MANIFEST}), "
        "not a deployment: nothing was opened or made there, and the backup is as it was"
    )


def refuse_wrong_stores(settings: Settings, engine: sa.Engine | None = None) -> None:
    """The looks every start takes before it opens or makes anything: a backup's folder
    (``refuse_backup_folder``, exit 8), stores or a key folder that cannot be written
    (``refuse_unwritable_stores``, exit 1), another program's store file
    (``refuse_another_programs_store``, exit 8). ``uprof.bootstrap.bootstrap`` asks them,
    and so does ``uprof restore`` before it copies anything: it copies the backup's
    stores over the data folder's before its start, so a backup's folder, a folder that
    cannot be written and another program's file were written over or told as the
    outage (bugs XX, XZ, YB). ``engine``: the start's (``start_engine``), asked through
    and left open."""
    refuse_backup_folder(settings)
    refuse_unwritable_stores(settings, engine)
    refuse_another_programs_store(settings)


def refuse_unwritable_stores(settings: Settings, engine: sa.Engine | None = None) -> None:
    """Raise ``StoresUnwritableError`` (exit 1) when the data stores of ``settings``
    cannot be written by this process (its backend's ``why_unwritable``), naming the data
    folder or database and why; ``KeyFolderUnwritableError`` (exit 1) when its key
    folder cannot be made, or its key store written (``_why_key_folder_unwritable``).
    Asked at every start before any store is opened: a SQLite store that cannot be
    opened for writing was told as the outage, "retry after a few seconds", and a
    read-only PostgreSQL database ended in a traceback (bug XQ); so was the key store
    in a key folder that cannot be written, and a key folder that could not be made
    ended in a ``PermissionError`` traceback (bug XY). ``engine``: the start's
    (``start_engine``), asked through and left open."""
    from domain.errors import KeyFolderUnwritableError, StoresUnwritableError

    backend = backend_for_settings(settings)
    why = backend.why_unwritable(settings, engine)
    if why is not None:
        raise StoresUnwritableError(f"{deployment_place(settings)} cannot be used: {why}")
    why = _why_key_folder_unwritable(settings.key_path, backend.key_folder_stores)
    if why is not None:
        raise KeyFolderUnwritableError(f"the key folder {settings.key_path} cannot be used: {why}")


def _why_key_folder_unwritable(keys: Path, stores: tuple[str, ...]) -> str | None:
    """Why the key folder ``keys`` cannot be made, or its store files (``stores``, the
    backend's ``key_folder_stores``) written, by this process; None where nothing says
    so. ``os.access`` asks the kernel as an open would, so an immutable folder or file
    and a read-only mount refuse root too (XQ's look, for the key folder). A key folder
    without a store file of its own (PostgreSQL's) is not asked to be writable: its
    files' own refusals name them (the lock files), and a reader runs without writing."""
    if not os.path.lexists(keys):
        above = keys.parent
        while not os.path.lexists(above):
            above = above.parent
        if not os.access(above, os.W_OK | os.X_OK):
            return f"the folder {above}, where it is to be made, cannot be written"
        return None
    if not stores or not keys.is_dir():
        return None  # the settings' rule names a key folder that is not a folder
    if not os.access(keys, os.W_OK | os.X_OK):
        return (
            "the folder cannot be written (SQLite makes its journal beside the key store, "
            f"{stores[0]})"
        )
    for name in sorted(os.listdir(keys)):
        if name.startswith(stores) and (keys / name).is_file():
            if not os.access(keys / name, os.R_OK | os.W_OK):
                return f"its file {name} (the key store) cannot be written"
    return None


def refuse_another_programs_store(settings: Settings) -> None:
    """Raise ``AnotherProgramsStoreError`` (exit 8) when a store file of ``settings`` is
    another program's database (its backend's ``another_programs_store``): asked at every
    start before any store is opened, the starts that make a deployment too, which wrote
    uprof's tables into it (bug XU). PostgreSQL: never (a database is shared)."""
    from domain.errors import AnotherProgramsStoreError

    found = backend_for_settings(settings).another_programs_store(settings)
    if found is not None:
        raise AnotherProgramsStoreError(
            f"the data folder {settings.data_dir} holds no uprof deployment: {found}; "
            "nothing was opened or made there"
        )


def holds_a_deployment(settings: Settings, engine: sa.Engine | None = None) -> bool:
    """Whether the data stores of ``settings`` hold a deployment (its backend's
    ``holds_a_deployment``): found without making anything. ``engine``: the start's
    (``start_engine``), asked through and left open."""
    return backend_for_settings(settings).holds_a_deployment(settings, engine)


def refuse_without_deployment(settings: Settings, engine: sa.Engine | None = None) -> None:
    """Raise ``DeploymentNotFoundError`` unless the data stores of ``settings`` hold a
    deployment, making nothing there. A command that reads or changes a deployment asks
    this before it opens the stores: opened, they are made, and the command answered
    about a new, empty deployment: "residue: 0", no API keys, a backup of nothing (bug
    WM, decision 0237-the-wrong-folder). The commands that start a deployment (``uprof
    init``, ``serve``, ``apps create``, ...) do not ask. ``engine``: as
    ``holds_a_deployment``'s."""
    from domain.errors import DeploymentNotFoundError

    if deployment_found(settings, engine):
        return
    why = (
        "it does not exist"
        if settings.database_url is None and not settings.data_dir.exists()
        else "it holds none of uprof's stores"
    )
    raise DeploymentNotFoundError(
        f"no uprof deployment in {deployment_place(settings)} ({why}): this command reads "
        "or changes an existing deployment and makes none; nothing was made there"
    )


def deployment_found(settings: Settings, engine: sa.Engine | None = None) -> bool:
    """``holds_a_deployment``, with a database the server does not have refused
    (``refuse_missing_database``, exit 8) rather than let out as the outage it looks
    like. Asked before anything is made: a command that creates made the key folder
    first, then met the missing database (bug XC). ``engine``: as
    ``holds_a_deployment``'s."""
    try:
        return holds_a_deployment(settings, engine)
    except Exception as error:
        refuse_missing_database(settings, error)
        raise


def refuse_missing_database(settings: Settings, error: BaseException) -> None:
    """Raise ``DatabaseNotFoundError`` (exit 8) when ``error``, raised opening the stores
    of ``settings``, is the server saying the database the URL names does not exist;
    else return, and the caller lets ``error`` go on (an outage stays one). A typo'd
    database name was told as an outage, "retry after a few seconds": waiting changes
    nothing (bug XC, decision 0242-the-wrong-folder-2). Asked only after a failure:
    a server that answers pays nothing more."""
    from domain.errors import DatabaseNotFoundError

    if settings.database_url is None:
        return
    if not backend_for_settings(settings).database_missing(settings, error):
        return
    given = sa.engine.make_url(settings.database_url)
    raise DatabaseNotFoundError(
        f"no uprof deployment in {deployment_place(settings)}: the server has no database "
        f"{given.database!r} (it does not exist); nothing was made there"
    ) from None


def policy_store_env(settings: Settings) -> dict[str, str]:
    """Return the eventsourcing settings of the policy store (``PolicyApplication``).

    SQLite: ``policies.sqlite`` beside the other stores. PostgreSQL: the same database as
    the profiles log, in tables of its own (``policies_events``, ``policies_snapshots``),
    named by eventsourcing after the application.
    """
    return backend_for_settings(settings).policy_store_env(settings)


def create_engine(url: str, *, fsync_each_commit: bool = False) -> sa.Engine:
    """Build an engine with the settings uprof relies on for this backend.

    ``hide_parameters``: a database error's message (which reaches logs and
    tracebacks) never quotes the statement's values.
    ``fsync_each_commit`` (SQLite): ``synchronous=FULL``, a commit survives a power cut,
    not only a process crash. The key store needs it: the event log (eventsourcing's
    connections) already commits FULL, and after a power cut an event whose capture key
    was lost could never be read again (decision 0017). Other stores keep NORMAL.
    """
    return backend_for_url(url).create_engine(url, fsync_each_commit=fsync_each_commit)


@dataclass(frozen=True)
class StoreEngines:
    """The engines of a deployment's three stores; one engine where two share a database."""

    views: sa.Engine
    keys: sa.Engine
    events: sa.Engine

    def distinct(self) -> list[sa.Engine]:
        """Each engine once (PostgreSQL: all three stores are one database)."""
        return list({id(e): e for e in (self.views, self.keys, self.events)}.values())

    def dispose(self) -> None:
        for engine in self.distinct():
            engine.dispose()


def start_engine(settings: Settings) -> sa.Engine | None:
    """The engine a start's checks ask through and its stores then use (``open_engines``'s
    ``made``), or None where the checks need none (SQLite: they look at files).

    PostgreSQL: every store is the one database of ``settings.database_url``, and each
    check (``holds_a_deployment``, ``why_unwritable``) made an engine and a connection of
    its own before the stores made theirs; through this one their connection goes back
    to the pool the start then takes its own from (0249-cli-start-cost). Made, not
    connected: whoever makes it disposes of it, unless ``open_engines`` took it."""
    if settings.database_url is None:
        return None
    return create_engine(settings.database_url)


def open_engines(layout: StorageLayout, *, made: sa.Engine | None = None) -> StoreEngines:
    """Engines for ``layout``'s stores, as a deployment opens them (the key store commits
    with fsync each time, ``create_engine``). ``made``: an engine ``start_engine`` made
    for the views store's URL, used for it (and its owner is then the returned
    ``StoreEngines``); one made for another URL is refused (``ValueError``)."""
    if made is not None and made.url != sa.engine.make_url(layout.views_url):
        raise ValueError("the start's engine is not for this deployment's views store")
    views = made if made is not None else create_engine(layout.views_url)
    keys = (
        views
        if layout.keys_url == layout.views_url
        else create_engine(layout.keys_url, fsync_each_commit=True)
    )
    events = views if layout.events_url == layout.views_url else create_engine(layout.events_url)
    return StoreEngines(views, keys, events)


def schema_lock(
    engine: sa.Engine, *, wait_s: float, purpose: str
) -> contextlib.AbstractContextManager[None]:
    """Let one starting process at a time create or migrate tables (and a rebuild
    replay the views alone).

    Two processes creating eventsourcing's tables at the same moment crash one of them
    in PostgreSQL's catalog ("tuple concurrently updated"), and two SQLite starts both
    create alembic's table; the backend orders them (an advisory lock on PostgreSQL,
    an flock on SQLite). A wait longer than a moment is reported, naming the holder,
    and ends after ``wait_s`` (``Settings.schema_lock_wait_s``; 0: no limit) with
    ``SchemaLockWaitError``; ``purpose`` says what the holder does, for those waiting.
    """
    return backend_for(engine).schema_lock(engine, wait_s=wait_s, purpose=purpose)


#: What a start holding its turn at the schema locks does (``SchemaTurn``), for those
#: waiting: short, so that PostgreSQL's session name (63 bytes) keeps it whole.
START_PURPOSE = "start: opening the stores"


def _same_lock(a: sa.Engine, b: sa.Engine) -> bool:
    """Whether two engines' schema locks are one lock: the same engine or database URL
    (PostgreSQL: one advisory key per database; SQLite: one lock file per database)."""
    return a is b or a.url == b.url


class SchemaTurn:
    """One turn at the schema locks of several stores (0256-start-lock-turns): each
    store's lock taken once, in the order given, all held until ``release`` (or the end
    of the ``with`` block), each waited for as ``schema_lock`` waits (its bound, its
    reports, its stops).

    A start took the lock at four moments (the views and keys' upgrade, the event log's
    tables, the policy store's, the erasure ledger's catch-up of the views); beside a
    process that rebuilds the views in a loop it waited out a rebuild round at each. Now
    it waits once. Stores whose locks are one (PostgreSQL: the views, keys and event log
    are one database, one advisory key) are taken once: a second take from another
    session of this process would wait for itself.

    Order, to never deadlock: the views' lock first, then the event log's. A rebuild
    (``Uprof.rebuild``) and the residue scan take the views' alone; nothing takes the
    event log's and then the views'."""

    def __init__(self, engines: tuple[sa.Engine, ...], *, wait_s: float, purpose: str) -> None:
        self._engines = engines
        self._wait_s = wait_s
        self._purpose = purpose
        self._held: list[sa.Engine] = []
        self._stack = contextlib.ExitStack()

    def take(self) -> SchemaTurn:
        """Wait for each store's lock in turn; on any failure (a wait given up, a stop)
        let go of those already held and raise."""
        try:
            for engine in self._engines:
                if any(_same_lock(engine, held) for held in self._held):
                    continue
                self._stack.enter_context(
                    schema_lock(engine, wait_s=self._wait_s, purpose=self._purpose)
                )
                self._held.append(engine)
        except BaseException:
            self.release()
            raise
        return self

    def holds(self, engine: sa.Engine) -> bool:
        """Whether this turn holds ``engine``'s schema lock now."""
        return any(_same_lock(engine, held) for held in self._held)

    def release(self) -> None:
        """Let go of every lock held (the last taken first); again: nothing."""
        self._held = []
        self._stack.close()

    def __enter__(self) -> SchemaTurn:
        return self.take()

    def __exit__(self, *exc: object) -> None:
        self.release()


def migrate(engine: sa.Engine, branch: str) -> None:
    """Bring one store's tables to the newest revision of its alembic branch.

    A store already at the branch head is left alone without importing alembic or
    running the migration environment (which imports every table module): every CLI
    command opens two stores, and alembic's import alone is ~0.15-0.25 s of a command
    that has nothing to migrate (decision 0035-observability).
    """
    head = branch_head(branch)
    current = _current_revisions(engine)
    if head is not None and head in current:
        return
    _refuse_unknown_revisions(engine, branch, current)
    _migrate_branch(engine, branch, f"{branch}@head", downgrade=False)


def _refuse_unknown_revisions(engine: sa.Engine, branch: str, current: set[str]) -> None:
    """Raise ``StoreOfANewerReleaseError`` when the store records a revision no migration
    of this release has (a newer release's): alembic's upgrade ended in its own
    traceback there (bug XP). Asked only where the store is not at the head already."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from domain.errors import StoreOfANewerReleaseError

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    known = {r.revision for r in ScriptDirectory.from_config(config).walk_revisions()}
    unknown = sorted(current - known)
    if unknown:
        url = engine.url
        store = (
            f"the {branch} store {Path(url.database or '').name}"
            if url.get_backend_name() == "sqlite"
            else f"the {branch} store in the database {url.database}"
        )
        raise StoreOfANewerReleaseError(
            f"{store} is at schema revision {', '.join(map(repr, unknown))}, which this "
            "uprof does not know: a newer release upgraded it; nothing was changed"
        )


def downgrade_to(engine: sa.Engine, branch: str, revision: str) -> None:
    """Take one store's tables of ``branch`` down to ``revision`` (alembic's own
    downgrades), in one transaction like ``migrate``: a restore of an older backup
    brings the live store to the backup's revision before it replaces its data, and the
    start after the copy upgrades it again (decision 0164-restore-across-upgrade)."""
    if revision in _current_revisions(engine):
        return
    _migrate_branch(engine, branch, revision, downgrade=True)


def _migrate_branch(engine: sa.Engine, branch: str, target: str, *, downgrade: bool) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["branch"] = branch
    # One transaction for the whole change, on every backend: a process killed midway
    # leaves the store at its previous revision, whole (bug JA).
    with backend_for(engine).migration_transaction(engine) as conn:
        config.attributes["connection"] = conn
        (command.downgrade if downgrade else command.upgrade)(config, target)


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
    The headers are read once per process for the same files (``_revision_headers``).
    """
    versions = MIGRATIONS_DIR / "versions"
    files = []
    for path in sorted(versions.glob("*.py")):
        stat = path.stat()
        files.append((path.name, stat.st_ino, stat.st_size, stat.st_mtime_ns))
    headers = _revision_headers(versions, tuple(files))
    if headers is None:
        return None
    parent: dict[str, str | None] = {}
    root = None
    for revision, down, labels in headers:
        parent[revision] = down
        if f'"{branch}"' in labels:
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


@functools.lru_cache(maxsize=16)
def _revision_headers(
    versions: Path, files: tuple[tuple[str, int, int, int], ...]
) -> tuple[tuple[str, str | None, str], ...] | None:
    """(revision, down revision, branch labels) of each revision file, None if a file's
    header is not plainly written.

    Cached per process, keyed by the folder and each file's name, inode, size and
    modification time: every start asks for three branches' heads, and reading and
    parsing the files each time was ~0.7 ms of a start's CPU; a changed, added or
    removed file is a new key, so it is read again.
    """
    out = []
    for name, *_ in files:
        fields = dict(_HEADER.findall((versions / name).read_text("utf-8")))
        if "revision" not in fields or "down_revision" not in fields:
            return None
        down = fields["down_revision"]
        out.append(
            (
                fields["revision"].strip('"'),
                None if down == "None" else down.strip('"'),
                fields.get("branch_labels", ""),
            )
        )
    return tuple(out)


def _current_revisions(engine: sa.Engine) -> set[str]:
    """The revisions recorded in the store's ``alembic_version`` table (none: a new store).

    Read on the connection this thread's schema lock is held on, where there is one
    (``reading_connection``: a start asks this under the lock), not on a second one."""
    with reading_connection(engine) as conn:
        return _revisions_on(conn)


def _revisions_on(conn: sa.Connection) -> set[str]:
    if not sa.inspect(conn).has_table("alembic_version"):
        return set()
    rows = conn.execute(sa.text("SELECT version_num FROM alembic_version"))
    return {row[0] for row in rows}


def log_holds_events(engine: sa.Engine) -> bool:
    """Whether the event log already holds any event (read through the driver).

    Asked before a deployment creates new key material: keys are only ever new for a
    new log. The engine is the deployment's own (pooled, kept open): a probe connection
    closed here would drop this process's SQLite locks (FIELD-NOTES 8.1).
    """
    inspector = sa.inspect(engine)
    with engine.connect() as conn:
        for schema, name in backend_for(engine).events_table_candidates(engine):
            if not inspector.has_table(name, schema=schema):
                continue
            table = sa.table(name, schema=schema)
            if conn.execute(sa.select(sa.literal(1)).select_from(table).limit(1)).first():
                return True
    return False


def audit_log_holds_entries(engine: sa.Engine) -> bool:
    """Whether the audit log (``audit_entries``, in the views store) holds any entry: a
    deployment's data even before its first captured event (an API key issued, a policy
    changed), written under its keys. Asked with ``log_holds_events`` before a start
    creates key material (bug XD, decision 0242-the-wrong-folder-2)."""
    if not sa.inspect(engine).has_table(AUDIT_ENTRIES_TABLE):
        return False
    with engine.connect() as conn:
        table = sa.table(AUDIT_ENTRIES_TABLE)
        return (
            conn.execute(sa.select(sa.literal(1)).select_from(table).limit(1)).first() is not None
        )


#: The audit log's table of entries (migrations/versions/0002_audit_create_audit_log_tables).
AUDIT_ENTRIES_TABLE = "audit_entries"


def fold_log(engine: sa.Engine, *, timeout_s: float | None = None) -> bool:
    """Fold a write-ahead log into the main file (SQLite: checkpoint and truncate the WAL),
    so shredded bytes do not linger; nothing on a backend whose log is not ours to fold.
    False when another process's read transaction kept the WAL from being truncated
    within ``timeout_s`` (the backend's bound if None; 0 is a single short try)."""
    return backend_for(engine).fold_log(engine, timeout_s=timeout_s)
