"""An erasure run in one process while ``uprof projections rebuild`` resets the views in
another (SQLite and PostgreSQL, a real second process).

Found in the review of decision 0108: a process without background workers (the CLI,
``uprof subjects erase`` on the default SQLite deployment) catches the views up itself
(``Uprof.process``). A rebuild in another process that reset the views between that
run's read of a batch and its apply made the apply refuse it (``PositionMovedError``,
decision 0103: nothing written, re-read the position), and ``process`` passed the
refusal up: the erasure failed with exit 6 ("another worker processed this range
first") after its keys were destroyed, and any embedded read that caught the views up
failed the same way. The refused batch is now read again from the new position, as
every runner does (``uprof worker``, a server's reads).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.children import PythonChild
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, say, settings_for

WAIT_S = 120

#: A real rebuild that resets the views when told, then waits before its replay.
REBUILD = """
import sys, time
from pathlib import Path
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for

backend = Backend(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
start, was_reset, go = Path(sys.argv[4]), Path(sys.argv[5]), Path(sys.argv[6])
kernel = build_kernel(settings_for(backend), FakeClock())
views = kernel.projections._views
reset = views.reset

def held(*args, **kwargs):
    reset(*args, **kwargs)
    was_reset.touch()
    while not go.exists():
        time.sleep(0.01)

views.reset = held
while not start.exists():
    time.sleep(0.01)
try:
    kernel.rebuild()
finally:
    kernel.close()
"""


def _wait_for(path: Path, child: PythonChild) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert child.poll() is None, child.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


@contextmanager
def reset_elsewhere_before_next_apply(
    kernel: Any, backend: Backend, tmp_path: Path
) -> Iterator[None]:
    """Within the block, the kernel's next batch apply meets a reset of the views by a real
    rebuild in another process: the batch is read, the other process resets, then the
    apply runs (and is refused, decision 0103). The rebuild finishes after the block and
    must exit 0."""
    start, was_reset, go = tmp_path / "start", tmp_path / "reset", tmp_path / "go"
    child = PythonChild(
        REBUILD,
        backend.kind,
        backend.url,
        str(backend.data_dir),
        str(start),
        str(was_reset),
        str(go),
    )
    views = kernel.projections._views
    apply = views.apply_batch

    def reset_elsewhere_first(*args: Any, **kwargs: Any) -> Any:
        views.apply_batch = apply
        start.touch()
        _wait_for(was_reset, child)
        return apply(*args, **kwargs)

    views.apply_batch = reset_elsewhere_first
    try:
        yield
    finally:
        views.apply_batch = apply
        start.touch()
        go.touch()
        _, err = child.communicate(timeout=WAIT_S)
    assert child.returncode == 0, err[-3000:]


def test_an_erasure_whose_catch_up_meets_another_processs_reset_completes(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    kernel = build_kernel(settings_for(backend), clock)
    try:
        for subject in ("alice", "erin"):
            consent(kernel, subject)
            kernel.capture(subject, say(f"I live in Paris, says {subject}", day=1))
        kernel.process()
        erased_stream = str(kernel.stream_of("erin"))
        # The erasure's catch-up has read its batch (the tombstone) when the reset lands.
        with reset_elsewhere_before_next_apply(kernel, backend, tmp_path):
            result = kernel.erase_subject("erin")

        assert result.receipt["body"]["type"] == "gov.erasure-receipt/v1"
        kernel.process()
        digest = kernel.queries.table_digest([erased_stream])
        assert not any(digest.values()), digest
        live = kernel.queries.table_digest()
        assert len(live["consents"]) == 1  # alice's
        kernel.rebuild()
        assert kernel.queries.table_digest() == live
    finally:
        kernel.close()
