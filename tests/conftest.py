"""Shared fixtures: every storage test runs on SQLite and on PostgreSQL.

PostgreSQL is reached through ``UPROF_TEST_POSTGRES_URL`` (default: the local
server on 127.0.0.1:5432 with trust auth). Each test gets a database of its own under a
name no other test gets, holding what no earlier test wrote: ``backend`` takes a copy of
a schema-only template, or a copy an earlier test gave back, reset and renamed
(tests/templates.py); ``empty_backend`` creates one empty and drops it at teardown.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import multiprocessing
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa
import typer.main
import typer.testing
from xdist.scheduler import LoadScopeScheduling

if TYPE_CHECKING:
    from tests.templates import PgStores, SqliteTemplate

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

POSTGRES_ADMIN_URL = os.environ.get(
    "UPROF_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


@dataclass(frozen=True)
class Backend:
    """Where a test's data lives: a SQLAlchemy URL plus, for SQLite, the folder."""

    kind: str  # "sqlite" | "postgres"
    url: str
    data_dir: Path
    pg_dbname: str = ""


_ADMIN: list[sa.Engine] = []


OTHER_TENANT = "other-tenant"


def seed_policy_for(tenant: str, folder: Path, seed: Path | None = None) -> Path:
    """A seed policy (default: the packaged one) with its ``default`` tenant renamed, written
    into ``folder``: a second tenant's own policy."""
    from uprof.settings import Settings

    seed_text = (seed or Settings().policy_path).read_text(encoding="utf-8")
    out = folder / f"seed-{tenant}.csv"
    out.write_text(seed_text.replace(", default", f", {tenant}"), encoding="utf-8")
    return out


def _admin() -> sa.Engine:
    """This process's engine on the maintenance database (one pooled connection, kept:
    a test creates and drops a database, and a new connection each time costs the
    server a process)."""
    if not _ADMIN:
        _ADMIN.append(
            sa.create_engine(
                POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT", pool_size=1, pool_pre_ping=True
            )
        )
    return _ADMIN[0]


def _pg_url(name: str) -> str:
    return (
        sa.engine.make_url(POSTGRES_ADMIN_URL)
        .set(database=name)
        .render_as_string(hide_password=False)
    )


def _create_pg_database(template: str | None = None, prefix: str = "uprof_test") -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    copy = f' TEMPLATE "{template}"' if template else ""
    from tests.templates import relax_commit_flush

    with _admin().connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"{copy}'))
        relax_commit_flush(conn, name)
    return name


def _drop_pg_database(name: str) -> None:
    with _admin().connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@contextlib.contextmanager
def pg_database_down(name: str) -> Iterator[None]:
    """A test's PostgreSQL database out for the block: new connections refused and every
    session on it ended; open to connections again after it."""
    with _admin().connect() as conn:
        conn.execute(sa.text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
        conn.execute(
            sa.text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = :db AND pid <> pg_backend_pid()"
            ),
            {"db": name},
        )
    try:
        yield
    finally:
        with _admin().connect() as conn:
            conn.execute(sa.text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))


@contextlib.contextmanager
def database_down(backend: Backend, key_path: Path, *engines: sa.Engine) -> Iterator[None]:
    """The deployment's database out for the block, back after it. PostgreSQL: the test's
    database refuses new connections and its open ones are ended (``pg_database_down``).
    SQLite: the key store in ``key_path`` (``Settings.key_path``) is closed in ``engines``
    (the kernel's ``keys_engine``, a key store's own) and its file replaced by something
    SQLite cannot open (a folder of its name), so each new connection fails with
    SQLITE_CANTOPEN, an outage by decision 0184's rule (a store that cannot be opened)."""
    if backend.kind == "postgres":
        with pg_database_down(backend.pg_dbname):
            yield
        return
    store = key_path / "keys.sqlite"
    files = [store.with_name(store.name + suffix) for suffix in ("", "-wal", "-shm")]
    for engine in engines:
        engine.dispose()
    moved = [(f, f.with_name(f.name + ".gone")) for f in files if f.exists()]
    for live, gone in moved:
        live.rename(gone)
    store.mkdir()  # where the database was, something SQLite cannot open
    try:
        yield
    finally:
        store.rmdir()
        for engine in engines:
            engine.dispose()  # connections that failed to open, if any
        for live, gone in moved:
            gone.rename(live)


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> SqliteTemplate:
    """The SQLite store files of a first start, schema only, built once per session."""
    from tests.templates import SqliteTemplate

    return SqliteTemplate(tmp_path_factory.mktemp("sqlite-template"))


@pytest.fixture(scope="session")
def _pg_stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgStores]:
    """PostgreSQL stores with the schema of a first start and no rows: a template built
    once per session (per xdist worker), never connected to while tests copy it, and the
    copies given back by tests, reset (tests/templates.py, ``PgStores``)."""
    from tests.templates import PgStores, check_holds_only_schema, create_schema, wait_until_unused
    from uprof.settings import Settings

    name = _create_pg_database(prefix="uprof_template")
    stores = None
    try:
        url = _pg_url(name)
        data_dir = tmp_path_factory.mktemp("pg-template") / "data"
        create_schema(Settings(data_dir=data_dir, database_url=url, embedder="hashing"))
        check_holds_only_schema(url)
        stores = PgStores(_admin(), name, _pg_url)
        wait_until_unused(_admin(), name)
        yield stores
    finally:
        if stores is not None:
            stores.close()
        _drop_pg_database(name)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """A store of the test's own on each backend, its schema at head and no rows.

    PostgreSQL: a database created for the test from the session's template (the whole
    database, ``url``). SQLite: the store files copied into ``data_dir / "data"`` and its
    key folder ``data_dir / "data.keys"`` (where the fixtures' Settings put them); ``url``
    is an empty file. Tests of what a first start or a migration does on an empty store
    take ``empty_backend``.
    """
    with store_from_template(request, request.param, tmp_path) as store:
        yield store


@contextlib.contextmanager
def store_from_template(
    request: pytest.FixtureRequest, kind: str, folder: Path
) -> Iterator[Backend]:
    """A store copied from the session's template of ``kind`` into ``folder`` (SQLite) or
    a database of its own (PostgreSQL: a copy, reset and renamed for a later test once
    this one is done, ``PgStores``)."""
    if kind == "sqlite":
        request.getfixturevalue("_sqlite_template").copy_into(folder)
        yield Backend("sqlite", f"sqlite:///{folder / 'uprof.sqlite'}", folder)
        return
    stores: PgStores = request.getfixturevalue("_pg_stores")
    name = stores.take()
    try:
        yield Backend("postgres", _pg_url(name), folder, name)
    finally:
        stores.give_back(name)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """A fresh, empty store on each backend: no table at all (first starts, migrations)."""
    if request.param == "sqlite":
        yield Backend("sqlite", f"sqlite:///{tmp_path / 'uprof.sqlite'}", tmp_path)
        return
    name = _create_pg_database()
    try:
        yield Backend("postgres", _pg_url(name), tmp_path, name)
    finally:
        _drop_pg_database(name)


@pytest.fixture
def spans() -> Iterator[object]:
    """Tracing on for one test, into the SDK's in-memory exporter (returned)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from uprof import telemetry

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with telemetry.tracing_to(provider):
        yield exporter
    provider.shutdown()


# Typer builds the whole click command tree from the functions' signatures on every
# `CliRunner.invoke` (typer.testing calls `get_command(app)` each time): ~0.1-0.15 s per call
# for uprof's ~100 commands, paid by every CLI test call (decision 0065). The tree is the same
# for the same app object and a click command keeps no state between invocations, so the
# tests build it once per app. A `uprof` process builds it once too, at its start.
assert callable(getattr(typer.testing, "_get_command", None)), "typer.testing changed"
typer.testing._get_command = functools.cache(typer.main.get_command)  # type: ignore[attr-defined]


# The multi-process scenarios (real servers and workers started, killed and restarted) are
# handed out first: under `--dist load` they then overlap the many short in-process tests,
# instead of all running together at the end, where each waits on the others' processes.
_RUN_FIRST = ("tests/reliability/", "tests/e2e/")


# Tests marked `model` import torch and sentence-transformers and load a real model: ~7 s
# of CPU for the imports alone in each process that does it first (2 vCPU, busy). Under
# `--dist load` every test worker ended up paying it. `--dist loadgroup` cannot group them
# (pytest-xdist#1386: with pytest 9.2 its group marks are silently ignored), so the
# scheduler below hands the files holding them to one worker as one unit, and the other
# tests one by one (decision 0065). Collection checks that every `model` test is in one of
# these files, so a new one cannot silently land elsewhere.
MODEL_FILES = (
    "tests/bench/test_baselines.py",
    "tests/bench/test_minilm.py",
    "tests/bench/test_reproduction.py",
    "tests/e2e/test_offline_and_cli.py",
    "tests/retrieval/test_adapters.py",
    "tests/retrieval/test_models.py",
)


class _ModelFilesOnOneWorker(LoadScopeScheduling):  # type: ignore[misc]  # untyped
    """`--dist load`, except that the tests of MODEL_FILES are one unit of work."""

    def _split_scope(self, nodeid: str) -> str:
        return "model files" if nodeid.split("::", 1)[0] in MODEL_FILES else nodeid


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "load":
        return None
    return _ModelFilesOnOneWorker(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(_RUN_FIRST))  # stable
    stray = [
        item.nodeid
        for item in items
        if item.get_closest_marker("model") and item.nodeid.split("::", 1)[0] not in MODEL_FILES
    ]
    if stray:
        raise pytest.UsageError(
            "tests marked `model` outside tests/conftest.py MODEL_FILES: " + ", ".join(stray)
        )


# The cyclic garbage collector in a test process. A full collection walks every tracked
# object still alive, and an xdist worker holds more and more of them: the libraries and
# test modules imported at collection (~170,000 objects), then what tests leave behind
# (module state, caches, a loaded model: 340,000-670,000 objects after ~70 tests). Run on
# three test files (-n 2), full collections took 3.0-3.6 s of each worker's ~50 s, and
# 1.1-1.5 s with what is alive at the end of collection and at the end of each test file
# frozen (gc.freeze, after a collection of the garbage there is): frozen objects are not
# scanned again. Nothing else changes: the thresholds are Python's, freed objects are
# freed, garbage is collected (and its unraisable exceptions reported) as before, and no
# object a running test created is frozen. A frozen object that later ends up in a
# reference cycle is not collected: memory only, in a test process.


def _freeze_survivors() -> None:
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session: pytest.Session) -> None:
    _freeze_survivors()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    try:
        return (yield)
    finally:
        if nextitem is None or nextitem.path != item.path:
            _freeze_survivors()


# A multiprocessing child that a test leaves running (a failure before its join, a child
# stuck on a barrier another one never reached) is joined, without a bound, by
# multiprocessing's exit handler when the test process ends: the run then hangs after its
# last test instead of reporting the failure. Such children are killed when the test that
# started them ends, and the test gets an error naming them.


def kill_leftover_children() -> list[str]:
    """Kill and reap this process's multiprocessing children still running, but those a
    fixture holds (``tests.children.held_by_fixture``: it stops them in its teardown, and
    fails if it could not); their names."""
    from tests.children import held_by_a_fixture

    leftovers = [c for c in multiprocessing.active_children() if not held_by_a_fixture(c.pid)]
    for child in leftovers:
        child.kill()
    for child in leftovers:
        child.join(30)
    return [f"{child.name} (pid {child.pid})" for child in leftovers]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    # After the test body, before its fixtures' teardown: a child still running here is
    # one the test did not wait for (a fixture's own are held: ``held_by_fixture``).
    try:
        outcome = yield
    except BaseException:
        kill_leftover_children()  # the test's own failure is the report
        raise
    left = kill_leftover_children()
    if left:
        raise AssertionError(f"the test left multiprocessing children running: {left}")
    return outcome
