"""A rebuild beside another process's projection runner (SQLite and PostgreSQL).

``uprof projections rebuild`` empties the views and sets every position back to 0, then
replays the log. A runner in another process (a server's worker, ``uprof worker``) that
read its batch before the reset and applied it after found position 0 in its
transaction, applied its batch and moved the position to the batch's end: the rebuild
then went on from there, and every event before that batch was missing from the views
for good (the subjects' consents, captures and items; live no longer equal to a rebuild).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from tests.children import PythonChild
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, say, settings_for

WAIT_S = 120


def _wait_for(path: Path, child: PythonChild) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert child.poll() is None, child.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


RUNNER = """
import sys, time
from pathlib import Path
from domain.errors import PositionMovedError
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for

backend = Backend(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
ready, go = Path(sys.argv[4]), Path(sys.argv[5])
kernel = build_kernel(settings_for(backend), FakeClock())
views = kernel.projections._views
apply = views.apply_batch

def held(*args, **kwargs):
    # The batch was read at the views' position; apply it once the rebuild has reset them.
    ready.touch()
    while not go.exists():
        time.sleep(0.01)
    views.apply_batch = apply
    return apply(*args, **kwargs)

views.apply_batch = held
try:
    kernel.projections.run_once()
except PositionMovedError:
    # What a worker does with it: read the position and the log again, and go on.
    kernel.projections.run_once()
finally:
    kernel.close()
"""


def test_a_rebuild_beside_another_runner_loses_no_event(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = settings_for(backend)
    kernel = build_kernel(settings, clock)
    try:
        consent(kernel, "alice")
        kernel.capture("alice", say("I live in Paris", day=1))
        kernel.process()  # alice is in the views: the position is past her events
        consent(kernel, "bob")
        kernel.capture("bob", say("I want to climb a mountain", day=2))
        kernel.extraction.run_until_idle()  # bob's events wait for a projection run
        ready, go = tmp_path / "ready", tmp_path / "go"
        child = PythonChild(
            RUNNER, backend.kind, backend.url, str(backend.data_dir), str(ready), str(go)
        )
        _wait_for(ready, child)  # the other runner holds bob's batch, read before the reset

        views = kernel.projections._views
        reset = views.reset

        def reset_then_let_the_runner_apply(*args: Any, **kwargs: Any) -> None:
            reset(*args, **kwargs)
            go.touch()
            _, err = child.communicate(timeout=WAIT_S)
            assert child.returncode == 0, err[-3000:]

        views.reset = reset_then_let_the_runner_apply  # type: ignore[method-assign]
        kernel.rebuild()
        views.reset = reset  # type: ignore[method-assign]
        live = kernel.queries.table_digest()

        assert len(live["consents"]) == 2  # alice's, projected before bob's batch, too
        kernel.rebuild()  # alone this time
        assert kernel.queries.table_digest() == live
    finally:
        kernel.close()


HOLDING = """
import sys, time
from pathlib import Path
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for

backend = Backend(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
ready, go = Path(sys.argv[4]), Path(sys.argv[5])
kernel = build_kernel(settings_for(backend), FakeClock())
projector = kernel.projections._views.projector
position = projector.position

def held(*args, **kwargs):
    # Inside the batch's transaction, its position row locked, no view row written yet.
    ready.touch()
    while not go.exists():
        time.sleep(0.01)
    del projector.position
    return position(*args, **kwargs)

projector.position = held
try:
    kernel.projections.run_once()
finally:
    kernel.close()
"""


def _waiting_on_a_lock(url: str) -> bool:
    """Whether a session of this PostgreSQL database waits for a lock."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return bool(
                conn.execute(
                    sa.text(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    )
                ).scalar()
            )
    finally:
        engine.dispose()


def test_a_rebuild_waits_for_a_runner_in_the_middle_of_its_batch(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The reset deleted every view row, then set the positions to 0; a runner's batch
    locks its position row, then writes view rows. A runner in another process that
    held its position row when the reset began then waited for a row the reset had
    deleted, while the reset waited for the position row: PostgreSQL killed one of them
    (DeadlockDetected), failing the rebuild (``uprof projections rebuild`` beside a live
    server, exit 1) or the server's batch. The reset now takes the position rows first."""
    settings = settings_for(backend)
    kernel = build_kernel(settings, clock)
    try:
        consent(kernel, "alice")
        kernel.capture("alice", say("I live in Paris", day=1))
        kernel.process()  # alice's rows are in the views
        kernel.capture("alice", say("I want to climb a mountain", day=2))
        kernel.extraction.run_until_idle()  # her new events wait for a projection run
        ready, go = tmp_path / "ready", tmp_path / "go"
        child = PythonChild(
            HOLDING, backend.kind, backend.url, str(backend.data_dir), str(ready), str(go)
        )
        _wait_for(ready, child)  # the other runner holds alice's position row

        def let_the_runner_go() -> None:
            if backend.kind == "postgres":
                # Once the reset waits for the runner's lock (after its deletes, before).
                deadline = time.monotonic() + WAIT_S
                while not _waiting_on_a_lock(backend.url) and time.monotonic() < deadline:
                    time.sleep(0.02)
            go.touch()

        releaser = threading.Thread(target=let_the_runner_go)
        releaser.start()
        try:
            kernel.rebuild()
        finally:
            go.touch()
            releaser.join()
            _, err = child.communicate(timeout=WAIT_S)
        assert child.returncode == 0, err[-3000:]
        kernel.process()
        live = kernel.queries.table_digest()
        assert len(live["consents"]) == 1
        kernel.rebuild()  # alone this time
        assert kernel.queries.table_digest() == live
    finally:
        kernel.close()
