"""Review of decision 0149 (schema upgrades, backup and restore with real processes), both
backends (decision 0156-review-of-0149).

- JI: a backup made by a newer release carries its schema revisions; the restore compared
  only the views branch's, so a SQLite backup whose event log (``events.sqlite``, copied
  whole with its ``alembic_version``) was at an events revision this release does not
  know was copied over the live stores before the start inside the restore failed
  ("Can't locate revision"): marker left, every start refused, stores replaced.
- Held, kept as tests: a first start on an empty store killed after each of several
  statements of its migrations; the stores and pooled connections after a first start
  (WAL, the driver's transaction handling restored); a restore of a backup at head into a
  store still at the previous schema.
"""

from __future__ import annotations

import json
import sqlite3
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

from benchmarks.schema_downgrade import PREVIOUS, downgrade_stores
from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, cli_env, settings_for
from tests.kernel.test_keys_apart import (
    BOB,
    assert_bob_intact,
    assert_intact,
    fill,
    filled_deployment,
)
from tests.kernel.test_upgrade_processes import (
    NEW_START,
    assert_upgraded_and_intact,
    previous_schema_store,
)
from tests.kernel.test_wal_switch_killed import _wait_for
from uprof.settings import Settings
from uprof.storage import RESTORE_MARKER, branch_head, create_engine, layout_for

#: Statements of a first start's migrations on an empty store (views, audit, keys, API
#: keys, the events branch's index), each a point where the start is killed right after.
FIRST_START_POINTS = [
    "CREATE TABLE alembic_version",
    "CREATE TABLE attributes",
    "CREATE TABLE audit_entries",
    "CREATE TABLE rate_limit_slots",
    "CREATE TABLE api_keys",
    "CREATE TABLE destroyed_capture_keys",
]

_KILLED_FIRST_START = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    import sqlalchemy as sa
    from tests.fakes.ports import FakeClock
    from tests.kernel.conftest import build_kernel
    from uprof.settings import Settings

    point = sys.argv[1]

    @sa.event.listens_for(sa.Engine, "after_cursor_execute")
    def _die(conn, cursor, statement, *rest):
        if " ".join(statement.split()).startswith(point):
            os._exit(9)

    settings = Settings(
        data_dir=Path(sys.argv[2]), database_url=sys.argv[3] or None, embedder="hashing"
    )
    build_kernel(settings, FakeClock()).close()
    print("started without reaching the point")
    """
)


def _revisions(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table("alembic_version"):
                return set()
            return {r[0] for r in conn.execute(sa.text("SELECT version_num FROM alembic_version"))}
    finally:
        engine.dispose()


@pytest.mark.parametrize("point", FIRST_START_POINTS)
def test_a_first_start_killed_inside_its_migrations_is_finished_by_the_next(
    empty_backend: Backend, clock: FakeClock, point: str
) -> None:
    settings = settings_for(empty_backend)
    url = empty_backend.url if empty_backend.kind == "postgres" else ""
    died = children.run_python(_KILLED_FIRST_START, point, str(settings.data_dir), url)
    assert died.returncode == 9, (died.stdout, died.stderr[-3000:])
    k = build_kernel(settings, clock)
    try:
        fill(k, "bob", BOB)
        assert_intact(k, "bob", BOB)
    finally:
        k.close()
    layout = layout_for(settings)
    assert branch_head("views") in _revisions(layout.views_url)
    assert branch_head("keys") in _revisions(layout.keys_url)
    assert branch_head("events") in _revisions(layout.events_url)


def test_after_a_first_start_the_stores_and_pooled_connections_are_as_configured(
    empty_backend: Backend, clock: FakeClock
) -> None:
    """The migrations ran in one explicit transaction with the driver's own handling off:
    the PRAGMAs set when a connection opens (WAL among them, which SQLite ignores inside
    a transaction) took effect, and the connection went back to the pool with the
    driver's transaction handling as the rest of uprof expects it."""
    settings = settings_for(empty_backend)
    k = build_kernel(settings, clock)
    try:
        with k.views_engine.connect() as conn:
            driver = conn.connection.driver_connection
            if empty_backend.kind == "sqlite":
                assert isinstance(driver, sqlite3.Connection)
                assert driver.isolation_level == ""
                assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
                assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            else:
                assert getattr(driver, "autocommit", None) is False
        # An implicit transaction still rolls back (it would not in autocommit mode).
        with k.views_engine.connect() as conn:
            conn.exec_driver_sql("CREATE TABLE review_probe (i INTEGER)")
            conn.commit()
            conn.exec_driver_sql("INSERT INTO review_probe VALUES (1)")
            conn.rollback()
            assert conn.exec_driver_sql("SELECT count(*) FROM review_probe").scalar() == 0
            conn.exec_driver_sql("DROP TABLE review_probe")
            conn.commit()
    finally:
        k.close()
    if empty_backend.kind == "sqlite":
        for path in sorted({*settings.data_dir.glob("*.sqlite"), *settings.key_path.glob("*")}):
            if path.suffix != ".sqlite":
                continue
            db = sqlite3.connect(path)
            try:
                assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal", path
            finally:
                db.close()


def test_a_backup_at_head_restores_into_a_store_still_at_the_previous_schema(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The operator installed this release, did not start it, and restores one of its
    backups: the live views are upgraded, then replaced; the key store is upgraded by the
    start inside the restore."""
    from uprof.services.backup import backup, restore

    settings = previous_schema_store(backend, clock)
    build_kernel(settings, clock).close()  # this release's first start: at head
    backup(settings, tmp_path / "bk")
    layout = layout_for(settings)
    downgrade_stores(layout, PREVIOUS)
    assert branch_head("views") not in _revisions(layout.views_url)
    restore(settings, tmp_path / "bk")
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    assert_upgraded_and_intact(settings, clock)


def _forge_a_newer_release_backup(settings: Settings, backend: Backend, bk: Path) -> None:
    """Make ``bk`` what a newer release of the same deployment writes: its schema ahead of
    this release's, the manifest signed again with the deployment's own key."""
    from uprof.services import backup as b

    manifest = json.loads((bk / b.MANIFEST).read_text(encoding="utf-8"))
    if backend.kind == "sqlite":
        # Views unchanged; the newer release added a revision to the events branch only,
        # and the event log's file carries it.
        events = bk / "events.sqlite"
        db = sqlite3.connect(events)
        try:
            with db:
                db.execute("UPDATE alembic_version SET version_num = '0002_events_newer'")
        finally:
            db.close()
        manifest["files"]["events.sqlite"] = {
            "sha256": b._sha256(events),
            "bytes": events.stat().st_size,
        }
    else:
        # A PostgreSQL backup carries no alembic_version (the dump leaves it out): the
        # revision it names is the manifest's.
        manifest["views_revision"] = "0009_views_newer"
    manifest.pop("signature", None)
    b._sign(settings, manifest)
    (bk / b.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def test_a_backup_of_a_newer_release_is_refused_and_changes_nothing(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Bug JI: on SQLite the restore compared the views' revision only; a backup whose
    event log a newer release had migrated was copied in, then the start inside the
    restore failed on the revision it does not know, the marker left behind."""
    from uprof.services.backup import BackupError, backup, restore

    settings = filled_deployment(backend, clock, "bob")
    backup(settings, tmp_path / "bk")
    _forge_a_newer_release_backup(settings, backend, tmp_path / "bk")
    with pytest.raises(BackupError, match="nothing was changed"):
        restore(settings, tmp_path / "bk")
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    layout = layout_for(settings)
    assert branch_head("events") in _revisions(layout.events_url)
    assert_bob_intact(settings, clock, audit_verifies=False)


_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import sqlalchemy as sa
    from uprof.storage import create_engine

    engine = create_engine(sys.argv[1])
    stop = Path(sys.argv[2])
    i = 0
    while not stop.exists():
        i += 1
        try:
            with engine.begin() as conn:
                conn.execute(sa.text("INSERT INTO review_writes (i) VALUES (:i)"), {"i": i})
            print("ack", i, flush=True)
        except Exception as error:
            print("error", i, type(error).__name__, str(error)[:200], flush=True)
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT count(*) FROM review_writes")).scalar_one()
    print("stopped", flush=True)
    """
)


def _create_review_writes(url: str) -> None:
    """The table the writer and holder children write their rows to, in the store at
    ``url`` (not one of uprof's: the upgrade must leave it and its rows alone)."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE review_writes (i INTEGER PRIMARY KEY)"))
    finally:
        engine.dispose()


def test_an_upgrade_beside_writers_and_readers_of_the_same_stores_loses_no_write(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """A process writes (one row a transaction) and reads the views and key stores while
    a start upgrades them from the previous schema: on SQLite the upgrade holds the write
    lock from its ``BEGIN IMMEDIATE`` to its commit, and the writers wait for it (busy
    timeout) instead of failing; every acknowledged write is there afterwards."""
    settings = previous_schema_store(backend, clock)
    layout = layout_for(settings)
    urls = sorted({layout.views_url, layout.keys_url})
    for url in urls:
        _create_review_writes(url)
    stop = tmp_path / "stop"
    writers = [children.PythonChild(_WRITER, url, str(stop), stream_stdout=True) for url in urls]
    try:
        for writer in writers:  # each has written once before the start begins
            assert writer.stdout is not None
            assert writer.stdout.readline().startswith("ack"), writer.communicate(30)
        assert_upgraded_and_intact(settings, clock)
    finally:
        stop.touch()
    for url, writer in zip(urls, writers, strict=True):
        out, err = writer.communicate(60)
        assert writer.returncode == 0, err[-3000:]
        assert "stopped" in out
        assert not [line for line in out.splitlines() if line.startswith("error")], out
        acked = {int(line.split()[1]) for line in out.splitlines() if line.startswith("ack")}
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                rows = set(conn.execute(sa.text("SELECT i FROM review_writes")).scalars())
        finally:
            engine.dispose()
        assert acked | {1} <= rows


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import sqlalchemy as sa
    from uprof.backends import backend_for
    from uprof.storage import create_engine

    engine = create_engine(sys.argv[1])
    stop = Path(sys.argv[2])
    with backend_for(engine).serialised_transaction(engine, 1) as conn:
        conn.execute(sa.text("INSERT INTO review_writes (i) VALUES (1)"))
        print("holding", flush=True)
        while not stop.exists():
            time.sleep(0.05)
    print("committed", flush=True)
    """
)


#: ``NEW_START`` that touches the file named by its last argument when it asks for the
#: views store's write lock (SQLite's ``BEGIN IMMEDIATE``): from then on it waits for
#: whoever holds that lock.
_START_SEEN_WAITING = (
    textwrap.dedent(
        """
        import sys
        from pathlib import Path
        import sqlalchemy as sa

        asked = Path(sys.argv.pop())

        @sa.event.listens_for(sa.engine.Engine, "before_cursor_execute")
        def _asks_the_write_lock(conn, _cursor, statement, *_):
            database = str(conn.engine.url.database or "")
            if statement.strip().upper() == "BEGIN IMMEDIATE" and database.endswith(
                "views.sqlite"
            ):
                asked.touch()
        """
    )
    + NEW_START
)


def test_an_upgrade_behind_a_long_write_transaction_waits_for_it(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Another process holds a write transaction on the views store (SQLite: its write
    lock) when a start must upgrade it: the start waits (busy timeout) and comes up once
    the writer commits; the writer's row is kept. On PostgreSQL nothing the start does
    takes the writer's lock: it comes up while the transaction is still open."""
    settings = previous_schema_store(backend, clock)
    layout = layout_for(settings)
    _create_review_writes(layout.views_url)
    stop = tmp_path / "stop"
    url = backend.url if backend.kind == "postgres" else ""
    holder = children.PythonChild(_HOLDER, layout.views_url, str(stop), stream_stdout=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding", holder.communicate(30)
        asked = tmp_path / "asked"
        start = children.PythonChild(_START_SEEN_WAITING, str(settings.data_dir), url, str(asked))
        try:
            if backend.kind == "sqlite":
                # The start asked for the write lock the holder has: it waits (SQLite's
                # busy handler, 30 s) until the commit below.
                _wait_for(asked, start)
            else:
                out, err = start.communicate(120)  # the transaction still open
                assert start.returncode == 0 and "started" in out, err[-3000:]
        finally:
            stop.touch()
        out, err = start.communicate(120)
        assert start.returncode == 0 and "started" in out, err[-3000:]
    finally:
        stop.touch()
        holder_out, holder_err = holder.communicate(60)
    assert holder.returncode == 0 and "committed" in holder_out, holder_err[-3000:]
    engine = create_engine(layout.views_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT i FROM review_writes")).scalars().all() == [1]
    finally:
        engine.dispose()
    assert_upgraded_and_intact(settings, clock)


#: Where a restore dies inside its revision checks (JB's, then JI's).
CHECK_POINTS = {
    "views-check": "import uprof.services.backup as b\nb._views_head = lambda: os._exit(9)\n",
    "files-check": (
        "import uprof.services.backup as b\nb._unknown_revisions = lambda *a: os._exit(9)\n"
    ),
}


@pytest.mark.parametrize("point", list(CHECK_POINTS))
def test_a_restore_killed_during_its_revision_checks_leaves_the_stores_as_they_were(
    backend: Backend, clock: FakeClock, tmp_path: Path, point: str
) -> None:
    """``uprof restore`` killed while it compares the backup's schema revisions: no marker,
    the next start serves the live data, and the restore run again finishes."""

    settings = filled_deployment(backend, clock, "bob")
    from uprof.services.backup import backup, restore

    backup(settings, tmp_path / "bk")
    env = cli_env(backend)
    script = "import os\n" + CHECK_POINTS[point] + "from uprof.cli.main import app\napp()\n"
    died = children.run_python(
        script, "restore", "--from", str(tmp_path / "bk"), env=env, timeout=180
    )
    assert died.returncode == 9, died.stdout + died.stderr[-3000:]
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    assert_bob_intact(settings, clock, audit_verifies=False)
    restore(settings, tmp_path / "bk")
    assert_bob_intact(settings, clock, audit_verifies=True)


def test_a_backup_whose_revision_is_missing_is_refused_and_changes_nothing(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Bug JJ: a manifest without ``views_revision`` (signed again, as a release that
    wrote none would sign it) passed the check of the manifest's fields and ended the
    restore in a ``KeyError``; it is refused naming the field, before anything changes."""
    from domain.errors import InvalidInputError
    from uprof.services import backup as b

    settings = filled_deployment(backend, clock, "bob")
    b.backup(settings, tmp_path / "bk")
    manifest = json.loads((tmp_path / "bk" / b.MANIFEST).read_text(encoding="utf-8"))
    del manifest["views_revision"]
    manifest.pop("signature", None)
    b._sign(settings, manifest)
    (tmp_path / "bk" / b.MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(InvalidInputError, match="views_revision"):
        b.restore(settings, tmp_path / "bk")
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    assert_bob_intact(settings, clock, audit_verifies=False)
