"""Review of decision 0112: ``uprof projections run`` beside another process's rebuild
(SQLite and PostgreSQL, a real second process).

Decision 0112 made the facade's ``process`` (``uprof projections run``) run
``Uprof.process_to_log_end`` instead of ``Uprof.process``. The review of 0108 had made
``process`` read a batch again when another process's rebuild reset the views between
the batch's read and its apply (``PositionMovedError``: nothing written, re-read the
position); ``process_to_log_end`` passed the refusal up, so ``projections run`` beside
a rebuild failed with exit 6 again. The projection's catch-up to a target now reads
the batch again from the new position, as every runner does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.children import PythonChild
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, say, settings_for
from tests.kernel.test_rebuild_beside_an_erasure import REBUILD, WAIT_S, _wait_for


def test_projections_run_whose_batch_meets_another_processs_reset_completes(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    kernel = build_kernel(settings_for(backend), clock)
    try:
        consent(kernel, "alice")
        kernel.process()
        kernel.capture("alice", say("I live in Paris", day=1))  # not yet extracted
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
            # The run has extracted and read its projection batch; the other process's
            # rebuild resets the views before it is applied.
            views.apply_batch = apply  # type: ignore[method-assign]
            start.touch()
            _wait_for(was_reset, child)
            return apply(*args, **kwargs)

        views.apply_batch = reset_elsewhere_first  # type: ignore[method-assign]
        try:
            kernel.process_to_log_end()  # what `uprof projections run` runs
        finally:
            views.apply_batch = apply  # type: ignore[method-assign]
            start.touch()
            go.touch()
            _, err = child.communicate(timeout=WAIT_S)
        assert child.returncode == 0, err[-3000:]
        assert kernel.projections.position >= kernel.app.max_notification_id()
        live = kernel.queries.table_digest()
        kernel.rebuild()
        assert kernel.queries.table_digest() == live
    finally:
        kernel.close()
