"""``uprof worker``'s loop beside another process's rebuild (SQLite and PostgreSQL, a real
second process).

Left by the review of decisions 0108 and 0109 (0111): a rebuild in another process that
resets the views between a worker batch's read and its apply makes the apply refuse the
batch (``PositionMovedError``, decision 0103: nothing written, read again from the new
position). ``Uprof.process`` and ``process_to_log_end`` read such a batch again
(``retry.WORKER_COLLISION``); ``Uprof.process_once``, the one ``uprof worker`` runs,
passed the refusal up. The loop (``uprof.cli.worker.run_loop``) then logged it at ERROR
with a traceback ("worker batch failed"), counted a failure (the "N failures" of the
worker's last line) and waited the supervisor's back-off (0.5 s, doubling while it
repeats) before projecting again: an operator alerting on ERROR lines or on that count
was told the worker failed when nothing had.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, say, settings_for
from tests.kernel.test_rebuild_beside_an_erasure import reset_elsewhere_before_next_apply
from uprof.cli.worker import run_loop
from uprof.kernel import Uprof


class _StopWhenCaughtUp:
    """Stops the loop once extraction and projections are caught up; records its waits."""

    def __init__(self, kernel: Uprof) -> None:
        self._kernel = kernel
        self.waits: list[float | None] = []

    def is_set(self) -> bool:
        return self._kernel.lag().caught_up

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return self.is_set()


def test_a_worker_batch_refused_after_another_processs_reset_is_no_failure(
    backend: Backend, clock: FakeClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kernel = build_kernel(settings_for(backend), clock)
    try:
        consent(kernel, "alice")
        kernel.process()
        kernel.capture("alice", say("I live in Paris", day=1))  # not yet extracted
        caplog.set_level(logging.INFO, logger="uprof.worker")
        # The loop's first batch is extracted and read when the reset lands.
        with reset_elsewhere_before_next_apply(kernel, backend, tmp_path):
            stop = _StopWhenCaughtUp(kernel)
            assert not stop.is_set()
            totals = run_loop(kernel, stop, idle_poll_s=0.0)

        assert totals["failures"] == 0, totals
        errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert errors == [], [r.getMessage() for r in errors]
        assert stop.waits == []  # no back-off was waited
        assert kernel.projections.position >= kernel.app.max_notification_id()
        live = kernel.queries.table_digest()
        kernel.rebuild()
        assert kernel.queries.table_digest() == live
    finally:
        kernel.close()
