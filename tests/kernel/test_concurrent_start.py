"""Processes that start at the same moment on a new store all come up.

Each start migrates three alembic branches (views, keys, events) and lets eventsourcing
create its tables. Alembic's "no version table yet: create it" is a read then a write, so
without a lock between processes all but one of them failed on a new SQLite store ("table
alembic_version already exists"); PostgreSQL queues them on an advisory lock. The
backend's ``schema_lock`` orders them on both.
"""

from __future__ import annotations

from pathlib import Path

from tests import children
from tests.conftest import Backend

STARTS = 3


def _start(data_dir: str, url: str | None, barrier: object, results: object) -> None:
    try:
        from tests.fakes.ports import FakeClock
        from tests.kernel.conftest import build_kernel
        from uprof.settings import Settings

        settings = Settings(data_dir=Path(data_dir), database_url=url, embedder="hashing")
        # Bounded: a sibling that failed before it would leave this one waiting for ever.
        barrier.wait(120)  # type: ignore[attr-defined]
        build_kernel(settings, FakeClock()).close()
        results.put("ok")  # type: ignore[attr-defined]
    except Exception as error:
        results.put(f"{type(error).__name__}: {str(error)[:300]}")  # type: ignore[attr-defined]


def starts_at_once(data_dir: Path, backend: Backend) -> list[str]:
    """STARTS processes start the deployment in ``data_dir`` (on ``backend``'s database)
    at the same moment: each one's ``ok`` or its error, in the order they finished."""
    context = children.CONTEXT
    barrier, results = context.Barrier(STARTS), context.Queue()
    url = backend.url if backend.kind == "postgres" else None
    processes = [
        context.Process(target=_start, args=(str(data_dir), url, barrier, results))
        for _ in range(STARTS)
    ]
    for process in processes:
        process.start()
    # Read before joining (multiprocessing's "joining processes that use queues"): a join
    # before the queued answers are read can deadlock.
    outcomes = [results.get(timeout=300) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    return outcomes


def test_processes_starting_at_once_on_a_new_store_all_come_up(empty_backend: Backend) -> None:
    assert starts_at_once(empty_backend.data_dir / "data", empty_backend) == ["ok"] * STARTS
