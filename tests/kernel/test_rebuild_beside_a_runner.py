"""A rebuild beside another process's projection runner (SQLite and PostgreSQL).

``uprof projections rebuild`` empties the views and sets every position back to 0, then
replays the log. A runner in another process (a server's worker, ``uprof worker``) that
read its batch before the reset and applied it after found position 0 in its
transaction, applied its batch and moved the position to the batch's end: the rebuild
then went on from there, and every event before that batch was missing from the views
for good (the subjects' consents, captures and items; live no longer equal to a rebuild).
"""

from __future__ import annotations

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
