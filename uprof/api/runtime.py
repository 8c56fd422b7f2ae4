"""What a long-running front door keeps beside the kernel: the pipeline lock and worker.

Two facts of the kernel shape this module:

- ``Uprof.process()`` (extraction, then projections) is not safe to run from two
  threads at once: both read the same position, and the loser's batch rolls back
  with ``PositionMovedError`` (the guarded position, uprof/recorders.py). Some
  reads (``profile``, ``evidence``, ``submit_proposals``, and ``slice`` when the
  kernel has no background workers) run it inline. So every such call, and the
  worker, takes ``pipeline_lock``.
- With ``settings.background_workers`` the server runs the pipeline in one
  background thread (``PipelineWorker``) and slices wait (bounded) for it instead
  of doing the work on the request thread. Every write through a front door calls
  ``wake()`` so the worker starts at once instead of at its next poll, and so does
  a slice that finds its subject behind (``Uprof.wake_workers``): a read waits for
  the worker, never for its poll interval. A slice whose subject is caught up wakes
  nothing, so the worker does not compete with it for the CPU.

A worker failure is never swallowed: it is logged with its traceback, counted,
shown by ``/readyz`` (not ready) and retried with a growing back-off.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from uprof import retry
from uprof.backends.damage import log_fault_or_damage
from uprof.kernel import Lag, Uprof

_log = logging.getLogger(__name__)

#: Idle poll: how long the worker sleeps when nothing woke it. Writes through this
#: process wake it at once; this bounds the delay for writes made by other processes.
IDLE_POLL_S = 0.05
#: ``PipelineWorker.stop``: after this long waiting for a run in progress it logs that it
#: is still waiting, and after ``STOP_GIVE_UP_S`` it stops waiting. The kernel closes its
#: stores right after the stop; a run cut off by that rolls its batch back (tracking is
#: saved with the batch), so giving up loses nothing, it only turns a slow batch (an LLM
#: extractor's calls) into one done again by the next start.
STOP_WARN_S = 10.0
STOP_GIVE_UP_S = 120.0

T = TypeVar("T")


@dataclass
class WorkerStatus:
    """What readiness and metrics report about the background worker."""

    state: str = "off"  # off | running | failing | stopped
    runs: int = 0
    processed: int = 0
    failures: int = 0
    last_error: str = ""


class PipelineWorker:
    """Run the kernel's extraction and projections in one daemon thread until stopped."""

    def __init__(self, kernel: Uprof, lock: threading.Lock) -> None:
        self._kernel = kernel
        self._lock = lock
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.status = WorkerStatus()

    def start(self) -> None:
        if self._thread is not None:
            return
        self.status.state = "running"
        self._thread = threading.Thread(target=self._run, name="uprof-pipeline", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, warn_s: float = STOP_WARN_S, give_up_s: float = STOP_GIVE_UP_S) -> None:
        """Stop after the run in progress, waiting for it (bounded) before returning.

        The caller closes the kernel's stores next: returning while a run still uses
        them (as a plain 10 s join did) closed them under it mid-batch.
        """
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(warn_s)
            if thread.is_alive():
                _log.warning("pipeline run still in progress; waiting for it to finish")
                thread.join(max(0.0, give_up_s - warn_s))
            if thread.is_alive():
                _log.error(
                    "pipeline run did not finish within %.0f s of the stop; the stores "
                    "close under it and its batch is rolled back",
                    give_up_s,
                )
        self.status.state = "stopped"

    def _run(self) -> None:
        failed_in_a_row = 0
        while not self._stop.is_set():
            self._wake.clear()
            try:
                with self._lock:
                    processed = self._kernel.process()
            except Exception as error:
                failed_in_a_row += 1
                backoff = retry.SUPERVISOR_BACKOFF.bound_s(failed_in_a_row)
                shown = log_fault_or_damage(
                    _log, error, "pipeline run failed; retrying in %.1f s", backoff
                )
                self.status.failures += 1
                # The class only: /readyz answers without a key, and a message may quote
                # what failed (an extractor's message quoted the capture it choked on).
                self.status.last_error = shown
                self.status.state = "failing"
                self._stop.wait(backoff)
                continue
            failed_in_a_row = 0
            self.status.runs += 1
            self.status.processed += processed
            self.status.state = "running"
            self.status.last_error = ""
            if processed == 0:
                self._wake.wait(IDLE_POLL_S)


class GovernanceAuthorizer(Protocol):
    """The part of ``policies.CasbinAuthorizer`` the governance operations need."""

    def authorize_all(
        self, *, app_id: str, tenant: str, action: str, purpose: str, categories: Iterable[str]
    ) -> tuple[Any, ...]: ...


class ExternalProgress:
    """How long the pipeline's pending work has not moved, as this server sees it, when
    ``uprof worker`` processes do that work (``serve --no-worker``): the server has no
    word from them, only the positions they move. Its readiness said ``external`` and
    nothing more, also with no worker running at all (bug WA)."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._lock = threading.Lock()
        #: Each worker position with work pending at the last look: where it was, and
        #: since when it has been there.
        self._seen: dict[int, tuple[int, float]] = {}

    def unmoved_s(self, lag: Lag) -> float:
        """Seconds the pending work has not moved (0 when nothing is pending): the longest
        any worker position with work pending has stayed where it is, counted from the
        first look that saw it pending (so at least that long).

        By position (``Lag.worked_to``): the log position less what is pending also moved
        for every write that is no capture (a consent, an erasure) and said 0 while no
        worker ran (bug WE); with workers split by partition, the live workers' moves
        said 0 while a dead one's partition waited (bug WG). New captures are not
        progress either."""
        now = self._monotonic()
        with self._lock:
            if lag.caught_up:
                # Work that appears later is counted from the look that first sees it: a
                # lower bound, never an alarm for work that has just arrived.
                self._seen = {}
                return 0.0
            seen: dict[int, tuple[int, float]] = {}
            for index, (position, pending) in enumerate(lag.worked_to):
                if not pending:
                    continue
                last = self._seen.get(index)
                seen[index] = (position, last[1] if last and last[0] == position else now)
            self._seen = seen
            return round(max((now - since for _, since in seen.values()), default=0.0), 1)


@dataclass
class ServiceRuntime:
    """The kernel plus what every front door shares: the pipeline lock and the worker."""

    kernel: Uprof
    pipeline_lock: threading.Lock = field(default_factory=threading.Lock)
    worker: PipelineWorker | None = None
    #: Called after every write and before every waiting read (the worker's wake-up).
    wake: Callable[[], None] = lambda: None
    #: Checks erasure and export requests. The kernel's governance methods take no app
    #: and check no policy, so the edge does, with the kernel's authorizer (the policy
    #: store's); a kernel without one falls back to the policy files.
    authorizer: GovernanceAuthorizer | None = None
    #: ``pipeline_unmoved_s`` of readiness for a server whose workers are external.
    external_progress: ExternalProgress = field(default_factory=ExternalProgress)

    @classmethod
    def for_kernel(
        cls, kernel: Uprof, authorizer: GovernanceAuthorizer | None = None
    ) -> ServiceRuntime:
        # One policy decision point per deployment: the kernel's (composition root).
        runtime = cls(kernel, authorizer=authorizer or kernel.authorizer)
        if kernel.settings.group_commit:
            # Stopped (after answering what is queued) before the kernel closes its stores.
            writer = kernel.capture_service.writer
            writer.start()
            kernel.worker_stoppers.append(writer.stop)
        if kernel.settings.background_workers and kernel.settings.run_worker:
            runtime.worker = PipelineWorker(kernel, runtime.pipeline_lock)
            runtime.wake = runtime.worker.wake
            kernel.wake_workers = runtime.worker.wake
            kernel.worker_stoppers.append(runtime.worker.stop)
        return runtime

    @property
    def background(self) -> bool:
        return self.kernel.settings.background_workers

    @contextmanager
    def pipeline(self) -> Iterator[None]:
        """Hold the pipeline lock around a kernel call that may run ``process()`` inline.

        With background workers the kernel never runs the pipeline on the caller's
        thread (its reads wait for the worker instead), so the lock is not taken: the
        worker being waited for needs it.
        """
        if self.background:
            self.wake()
            yield
            return
        with self.pipeline_lock:
            yield

    def call_waiting(self, operation: Callable[[], T]) -> T:
        """Run a kernel call that, with background workers, waits for the worker.

        Inline (no worker) it runs the pipeline itself, so it takes the lock. With a
        worker it must not hold the lock (the worker it waits for needs it); if an
        inline ``process()`` inside the call then collides with a worker on a
        position (``PositionMovedError``, raised before anything is written), the
        call is retried, a bounded number of times.
        """
        if not self.background:
            with self.pipeline_lock:
                return operation()
        result = retry.WORKER_COLLISION.call(operation)
        self.wake()
        return result

    def start(self) -> None:
        if self.worker is not None:
            self.worker.start()

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()

    def worker_state(self) -> str:
        """``running``, ``failing`` or ``stopped`` for this process's own pipeline worker;
        ``external`` when reads wait for ``uprof worker`` processes (``serve
        --no-worker``); ``inline`` when each read does the pipeline's work itself."""
        if self.worker is not None:
            return self.worker.status.state
        return "external" if self.background else "inline"

    def wait_caught_up(self, timeout_s: float) -> bool:
        """Wait (bounded) until derived stores reach the log head; for tests and benchmarks."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.kernel.lag().caught_up:
                return True
            time.sleep(0.01)
        return self.kernel.lag().caught_up
