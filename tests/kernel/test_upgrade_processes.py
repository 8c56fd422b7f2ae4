"""Schema upgrades with several real processes, both backends (decision
0149-upgrade-and-backup-processes).

A store of the previous schema is built from a store at head: the ``views`` branch taken
down to ``0007`` and the ``keys`` branch to ``0005`` (alembic's own downgrades), with a
subject's data in it. Then:

- a start killed (SIGKILL-like ``os._exit``) right after one statement of the upgrade, at
  each statement: the next start finishes the upgrade and serves the data. On SQLite
  each ``CREATE TABLE`` committed on its own (pysqlite opens a transaction only before
  DML), so a start killed midway left a table without its revision, and every later
  start failed "table ... already exists" (bug JA);
- three processes starting at the same moment on that store: all come up, the store
  ends at head, the data is served.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

from benchmarks.schema_downgrade import PREVIOUS, downgrade_stores
from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.test_concurrent_start import STARTS, starts_at_once
from tests.kernel.test_keys_apart import assert_bob_intact, filled_deployment
from uprof.settings import Settings
from uprof.storage import branch_head, create_engine, layout_for

#: The previous schema: each branch one or two revisions below its head.

#: Statements of the upgrade from PREVIOUS to head (views first, then keys), each a
#: point where a start is killed right after it ran.
KILL_POINTS = [
    "CREATE TABLE rate_limit_slots",
    "CREATE INDEX ix_rate_limit_slots_expires_at",
    "UPDATE alembic_version SET version_num='0008_views_rate_limit_slots'",
    "CREATE TABLE destroyed_keys",
    "CREATE TABLE destroyed_capture_keys",
]


def _revisions(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return {r[0] for r in conn.execute(sa.text("SELECT version_num FROM alembic_version"))}


def _engines(settings: Settings) -> tuple[sa.Engine, sa.Engine]:
    layout = layout_for(settings)
    views = create_engine(layout.views_url)
    keys = views if layout.keys_url == layout.views_url else create_engine(layout.keys_url)
    return views, keys


def previous_schema_store(backend: Backend, clock: FakeClock) -> Settings:
    """A deployment holding bob's data, its stores taken down to PREVIOUS."""
    settings = filled_deployment(backend, clock, "bob")
    downgrade_stores(layout_for(settings), PREVIOUS)
    views, keys = _engines(settings)
    try:
        assert PREVIOUS["views"] in _revisions(views)
        assert PREVIOUS["keys"] in _revisions(keys)
    finally:
        views.dispose()
        keys.dispose()
    return settings


def assert_upgraded_and_intact(settings: Settings, clock: FakeClock) -> None:
    assert_bob_intact(settings, clock, audit_verifies=False)
    views, keys = _engines(settings)
    try:
        assert branch_head("views") in _revisions(views)
        assert branch_head("keys") in _revisions(keys)
        with views.connect() as conn:
            assert sa.inspect(conn).has_table("rate_limit_slots")
        with keys.connect() as conn:
            assert sa.inspect(conn).has_table("destroyed_capture_keys")
    finally:
        views.dispose()
        keys.dispose()


_KILLED_START = textwrap.dedent(
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
        if point in " ".join(statement.split()):
            os._exit(9)

    settings = Settings(
        data_dir=Path(sys.argv[2]), database_url=sys.argv[3] or None, embedder="hashing"
    )
    build_kernel(settings, FakeClock()).close()
    print("started without reaching the point")
    """
)


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_start_killed_midway_through_an_upgrade_is_finished_by_the_next(
    backend: Backend, clock: FakeClock, point: str
) -> None:
    settings = previous_schema_store(backend, clock)
    url = backend.url if backend.kind == "postgres" else ""
    died = children.run_python(_KILLED_START, point, str(settings.data_dir), url, timeout=120)
    assert died.returncode == 9, (died.stdout, died.stderr[-3000:])
    assert_upgraded_and_intact(settings, clock)


def test_processes_starting_at_once_on_a_previous_schema_store_all_come_up(
    backend: Backend, clock: FakeClock
) -> None:
    settings = previous_schema_store(backend, clock)
    assert starts_at_once(settings.data_dir, backend) == ["ok"] * STARTS
    assert_upgraded_and_intact(settings, clock)


_OLD_PROCESS = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import sqlalchemy as sa
    from uprof.storage import create_engine

    # A process of the previous release: its transactions read the tables it knows.
    engines = [create_engine(url) for url in dict.fromkeys(sys.argv[1:3])]
    conns = [e.connect() for e in engines]
    gate = Path(sys.argv[3])
    tables = {"audit_entries", "subject_keys", "signed_out_sessions"}

    def counts():
        out = {}
        for conn in conns:
            for name in sorted(tables & set(sa.inspect(conn).get_table_names())):
                out[name] = conn.execute(sa.text(f"SELECT count(*) FROM {name}")).scalar_one()
        return out

    before = counts()
    print("holding", flush=True)
    while not gate.exists():
        time.sleep(0.02)
    assert counts() == before, (counts(), before)
    for conn in conns:
        conn.commit()
    print("after", counts() == before, flush=True)
    for conn in conns:
        conn.close()
    """
)

#: A start of this release, in its own process, on the store its arguments name.
NEW_START = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tests.fakes.ports import FakeClock
    from tests.kernel.conftest import build_kernel
    from uprof.settings import Settings

    settings = Settings(
        data_dir=Path(sys.argv[1]), database_url=sys.argv[2] or None, embedder="hashing"
    )
    build_kernel(settings, FakeClock()).close()
    print("started", flush=True)
    """
)


def test_a_start_upgrades_beside_a_process_of_the_previous_release_reading(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The previous release's process keeps its open read transactions on the tables it
    knows while a new start migrates: the start comes up (the upgrade only adds tables
    and indexes: it waits for no lock such a reader holds), and the old process reads
    on, its rows unchanged."""
    settings = previous_schema_store(backend, clock)
    layout = layout_for(settings)
    gate = tmp_path / "gate"
    old = children.PythonChild(
        _OLD_PROCESS, layout.views_url, layout.keys_url, str(gate), stream_stdout=True
    )
    try:
        assert old.stdout is not None
        assert old.stdout.readline().strip() == "holding", old.communicate()[1][-3000:]
        url = backend.url if backend.kind == "postgres" else ""
        new = children.run_python(NEW_START, str(settings.data_dir), url, timeout=120)
        assert new.returncode == 0 and "started" in new.stdout, new.stderr[-3000:]
    finally:
        gate.touch()
        out, err = old.communicate(timeout=60)
    assert old.returncode == 0 and "after True" in out, err[-3000:]
    assert_upgraded_and_intact(settings, clock)


def test_one_of_three_starts_killed_inside_the_upgrade_leaves_it_to_the_others(
    backend: Backend, clock: FakeClock
) -> None:
    """Three starts at once on a previous-schema store, one of them killed right after
    its first ``CREATE TABLE`` of the keys upgrade (while the others queue on the schema
    lock): the other two come up, the store at head and whole."""
    settings = previous_schema_store(backend, clock)
    url = backend.url if backend.kind == "postgres" else ""
    starts = [
        children.PythonChild(_KILLED_START, point, str(settings.data_dir), url)
        for point in ("CREATE TABLE destroyed_keys", "no such statement", "no such statement")
    ]
    outcomes = []
    for child in starts:
        out, err = child.communicate(timeout=180)
        outcomes.append((child.returncode, out.strip(), err[-2000:]))
    codes = sorted(code for code, _, _ in outcomes)
    # The first may find the store upgraded by another before it reached the point.
    assert codes in ([0, 0, 9], [0, 0, 0]), outcomes
    assert all("started" in out for code, out, _ in outcomes if code == 0), outcomes
    assert_upgraded_and_intact(settings, clock)
