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

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, say, settings_for
from tests.kernel.test_rebuild_beside_an_erasure import reset_elsewhere_before_next_apply


def test_projections_run_whose_batch_meets_another_processs_reset_completes(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    kernel = build_kernel(settings_for(backend), clock)
    try:
        consent(kernel, "alice")
        kernel.process()
        kernel.capture("alice", say("I live in Paris", day=1))  # not yet extracted
        # The run has extracted and read its projection batch when the reset lands.
        with reset_elsewhere_before_next_apply(kernel, backend, tmp_path):
            kernel.process_to_log_end()  # what `uprof projections run` runs
        assert kernel.projections.position >= kernel.app.max_notification_id()
        live = kernel.queries.table_digest()
        kernel.rebuild()
        assert kernel.queries.table_digest() == live
    finally:
        kernel.close()
