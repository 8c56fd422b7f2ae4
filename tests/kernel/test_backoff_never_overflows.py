"""A failure that lasts must not stop what retries it (review of decisions 0104 and 0105,
2026-12-05).

``Backoff.bound_s`` computed ``first_s * 2.0 ** (retry - 1)`` before capping it: the
1,025th retry in a row raised ``OverflowError``. Its callers count failures in a row
without bound and call it inside their ``except`` blocks, so the error escaped each of
them: the late ``capture.accepted`` check (1 s doubling to 60 s: after about 17 hours of an
audit store that does not answer) raised out of every pipeline run from then on; the
server's pipeline thread (0.5 s doubling to 30 s: after about 8.5 hours of failing runs)
died, and extraction and projections never ran again even once the store answered; the
``uprof worker`` loop exited. Both backends where a store is involved.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import consent, say
from tests.kernel.test_late_capture_check_failures import (
    checking_now,
    driver_error,
    late_of,
    later,
)
from uprof import retry
from uprof.api.runtime import PipelineWorker
from uprof.cli.worker import run_loop
from uprof.kernel import Uprof

#: More failures in a row than a double's exponent allows (2.0 ** 1024 overflows).
LONG_OUTAGE = 1_100


@pytest.mark.parametrize("backoff", [retry.SUPERVISOR_BACKOFF, retry.Backoff(1.0, 60.0)])
def test_a_bound_is_its_cap_however_many_retries(backoff: retry.Backoff) -> None:
    assert backoff.bound_s(LONG_OUTAGE) == backoff.max_s
    assert backoff.bound_s(10**9) == backoff.max_s


def test_a_late_check_failing_for_hours_still_never_raises(
    backend: Backend, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    kernel = checking_now(backend, clock)
    try:
        consent(kernel, "alice")
        kernel.capture("alice", say("I drink green tea"))
        error = driver_error(backend)

        def failing(*_a: Any, **_k: Any) -> Any:
            raise error

        late = late_of(kernel)
        late._log.holding = failing  # type: ignore[method-assign]
        caplog.set_level(logging.CRITICAL, logger="uprof.services.late_captures")
        kernel.process()
        for n in range(LONG_OUTAGE):  # a check at each back-off's end, for ~18 hours
            later(late, 61.0 * (n + 1))
            late.check_due()
        assert late.failures == LONG_OUTAGE + 1
        assert late.waiting == 1
    finally:
        kernel.close()


class _Failing:
    """A kernel whose every pipeline run fails (the stores do not answer)."""

    def __init__(self, runs: int) -> None:
        self.calls = 0
        self.runs = runs
        self.done = threading.Event()

    def process(self) -> int:
        self.calls += 1
        if self.calls >= self.runs:
            self.done.set()
        raise OSError("the store does not answer")


def test_the_servers_pipeline_thread_outlives_a_long_outage(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL, logger="uprof.api.runtime")  # 1,100 tracebacks
    # The same doubling, in nanoseconds: no real waiting.
    monkeypatch.setattr(retry, "SUPERVISOR_BACKOFF", retry.Backoff(1e-9, 1e-9))
    kernel = _Failing(LONG_OUTAGE)
    worker = PipelineWorker(kernel, threading.Lock())  # type: ignore[arg-type]
    worker.start()
    try:
        thread = worker._thread
        assert thread is not None
        while thread.is_alive() and not kernel.done.is_set():
            kernel.done.wait(0.05)
        assert kernel.done.is_set() and thread.is_alive()
        assert worker.status.failures >= LONG_OUTAGE - 1
        assert worker.status.state == "failing"
    finally:
        worker.stop()


class _StopAfter:
    def __init__(self, kernel: Uprof, failures: int) -> None:
        self._kernel = kernel
        self._failures = failures
        self.waits = 0

    def is_set(self) -> bool:
        return self.waits >= self._failures

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return self.is_set()


def test_the_worker_loop_outlives_a_long_outage(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL, logger="uprof.cli.worker")  # 1,100 tracebacks

    def failing() -> int:
        raise OSError("the store does not answer")

    monkeypatch.setattr(kernel, "process_once", failing)
    totals = run_loop(kernel, _StopAfter(kernel, LONG_OUTAGE), idle_poll_s=0.0)
    assert totals["failures"] == LONG_OUTAGE
