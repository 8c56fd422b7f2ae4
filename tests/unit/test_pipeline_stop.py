"""A server's background pipeline worker stops after the run in progress.

The kernel closes its stores right after ``PipelineWorker.stop`` returns. The stop used to
join the worker's thread for 10 s and return whether or not it had ended, so a slow run
(an LLM extractor's batch) had its stores closed under it mid-batch. Now the stop waits
for the run, saying so after ``warn_s``, and gives up only after ``give_up_s``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, cast

import pytest

from uprof.api.runtime import PipelineWorker
from uprof.kernel import Uprof


class SlowKernel:
    """A kernel whose ``process()`` runs until the test releases it."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()

    def process(self) -> int:
        self.entered.set()
        self.release.wait(30)
        self.finished.set()
        return 1


def _running(kernel: SlowKernel) -> tuple[PipelineWorker, threading.Thread]:
    worker = PipelineWorker(cast(Uprof, kernel), threading.Lock())
    worker.start()
    assert kernel.entered.wait(10), "the worker never ran"
    thread = cast(Any, worker)._thread
    assert isinstance(thread, threading.Thread)
    return worker, thread


def test_stop_waits_for_the_run_in_progress_past_its_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kernel = SlowKernel()
    worker, thread = _running(kernel)
    releaser = threading.Timer(0.5, kernel.release.set)
    releaser.start()
    with caplog.at_level(logging.WARNING, logger="uprof.api.runtime"):
        worker.stop(warn_s=0.05, give_up_s=20)
    assert kernel.finished.is_set()  # the run ended before the stop returned
    assert not thread.is_alive()
    assert worker.status.state == "stopped"
    assert "still in progress" in caplog.text
    releaser.join()


def test_stop_gives_up_after_its_bound_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    kernel = SlowKernel()
    worker, thread = _running(kernel)
    try:
        with caplog.at_level(logging.WARNING, logger="uprof.api.runtime"):
            worker.stop(warn_s=0.05, give_up_s=0.3)
        assert thread.is_alive() and not kernel.finished.is_set()
        assert "did not finish within" in caplog.text
    finally:
        kernel.release.set()
        thread.join(10)
    assert not thread.is_alive()  # the stop flag ended its loop after the run


def test_a_quick_stop_of_an_idle_worker_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    kernel = SlowKernel()
    kernel.release.set()  # every run returns at once
    worker, thread = _running(kernel)
    with caplog.at_level(logging.WARNING, logger="uprof.api.runtime"):
        worker.stop()
    assert not thread.is_alive()
    assert caplog.text == ""
