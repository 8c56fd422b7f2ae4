"""One retry policy for uprof: which failures earn another attempt, how many, how long apart.

A failure is retried only when it is one of the transient errors of ``domain/errors.py``
(``VersionConflictError``, ``StoreBusyError``, ``PositionMovedError``), which the stores
raise from their drivers' error types and codes; nothing here reads an error's message.
Each use below is a named ``RetryPolicy``; every loop that tries again runs through
``RetryPolicy.call`` (built on tenacity, decision 0032-one-retry-policy), and the two
long-running supervisors (the server's pipeline worker, ``uprof worker``) take their
back-off from ``SUPERVISOR_BACKOFF``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    retry_if_not_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random_exponential,
)
from tenacity.wait import wait_base

from domain.errors import PositionMovedError, StoreBusyError, UprofError, VersionConflictError

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """How long to wait before retry n (n = 1, 2, ...): ``first_s * 2**(n-1)``, capped at
    ``max_s``. With ``jitter`` the wait is drawn uniformly from 0 up to that bound ("full
    jitter"), so writers racing for one row spread out instead of colliding again in step;
    without it, it is the bound itself."""

    first_s: float = 0.0
    max_s: float = 0.0
    jitter: bool = False

    def bound_s(self, retry: int) -> float:
        """The wait (its upper bound, with jitter) before retry number ``retry``."""
        if self.first_s <= 0:
            return 0.0
        # The exponent capped: callers count failures in a row without bound, and
        # ``2.0 ** 1024`` raises OverflowError (inside their ``except`` blocks: a worker's
        # loop died after 1,024 failed runs in a row). 2**62 is past any cap.
        return min(self.max_s, self.first_s * 2.0 ** min(retry - 1, 62))

    def tenacity_wait(self) -> wait_base:
        if self.jitter:
            return wait_random_exponential(multiplier=self.first_s, max=self.max_s)
        return wait_exponential(multiplier=self.first_s, max=self.max_s)


#: Try again at once.
NO_WAIT = Backoff()


@dataclass(frozen=True)
class RetryPolicy:
    """How often to try one operation again, on which errors, and how long apart."""

    #: Attempts in all, the first included.
    attempts: int
    #: The transient errors worth another attempt; anything else is raised at once.
    on: tuple[type[BaseException], ...]
    backoff: Backoff = NO_WAIT
    #: Errors among ``on`` that are raised at once all the same (a broad ``on`` minus
    #: the errors that already say what to do).
    never: tuple[type[BaseException], ...] = ()
    #: The wait a failure asks for itself (a server's Retry-After), in seconds, or None
    #: for the back-off's; capped at ``backoff.max_s`` (a server's hint must not hold a
    #: caller for as long as it likes).
    told_wait: Callable[[BaseException], float | None] | None = None

    def _wait(self) -> wait_base:
        backoff = self.backoff.tenacity_wait()
        if self.told_wait is None:
            return backoff
        return _ToldOrBackoff(self.told_wait, backoff, self.backoff.max_s)

    def call(
        self,
        operation: Callable[[], T],
        *,
        before_retry: Callable[[BaseException], None] | None = None,
        give_up: Callable[[BaseException], BaseException] | None = None,
    ) -> T:
        """Run ``operation`` until it returns, fails with an error not in ``on``, or has
        used every attempt.

        ``before_retry(error)`` runs before each wait (to count or log the lost race).
        When the attempts are used up, the last error is raised, or ``give_up(error)``
        with the last error as its cause.
        """

        def report(state: RetryCallState) -> None:
            if before_retry is not None and state.outcome is not None:
                error = state.outcome.exception()
                if error is not None:
                    before_retry(error)

        # A fresh Retrying per call: tenacity keeps its attempt state per instance (and
        # thread), and a policy may run nested inside another one's operation.
        retrying = Retrying(
            stop=stop_after_attempt(self.attempts),
            wait=self._wait(),
            retry=retry_if_exception_type(self.on) & retry_if_not_exception_type(self.never),
            before_sleep=report,
            reraise=True,
        )
        try:
            return retrying(operation)
        except self.on as error:
            if give_up is None or isinstance(error, self.never):
                raise
            raise give_up(error) from error

    async def call_async(
        self,
        operation: Callable[[], Awaitable[T]],
        *,
        give_up: Callable[[BaseException], BaseException] | None = None,
    ) -> T:
        """``call`` for a coroutine function (the async SDK client), whose waits are
        awaited. ``operation`` must be an ``async def`` (tenacity awaits only those: a
        lambda returning a coroutine would be taken for a plain function)."""
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=self._wait(),
            retry=retry_if_exception_type(self.on) & retry_if_not_exception_type(self.never),
            reraise=True,
        )
        try:
            return await retrying(operation)
        except self.on as error:
            if give_up is None or isinstance(error, self.never):
                raise
            raise give_up(error) from error


class _ToldOrBackoff(wait_base):
    """Wait what the last failure asked for (``RetryPolicy.told_wait``), at most ``cap_s``;
    the back-off's wait when it asked for nothing."""

    def __init__(
        self, told: Callable[[BaseException], float | None], backoff: wait_base, cap_s: float
    ) -> None:
        self._told, self._backoff, self._cap_s = told, backoff, cap_s

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None else None
        told = self._told(error) if error is not None else None
        if told is None:
            return float(self._backoff(retry_state))
        return min(max(0.0, told), self._cap_s)


#: A load-decide-save command on one subject's stream lost the version race to another
#: writer (ProfilesApplication.with_retry). Writers of one subject in one process take
#: turns first; this spreads out the rest (other processes, other subjects' batches).
SUBJECT_WRITE = RetryPolicy(
    attempts=20, on=(VersionConflictError,), backoff=Backoff(0.002, 0.1, jitter=True)
)

#: An extraction batch lost to a capture of one of its subjects (version) or to another
#: worker that saved the same range (position): re-read and redo it.
EXTRACTION_BATCH = RetryPolicy(
    attempts=20,
    on=(VersionConflictError, PositionMovedError),
    backoff=Backoff(0.002, 0.2, jitter=True),
)

#: The extractor raised for one capture: try it twice more, a little apart. Any error
#: counts (the extractor is not ours to classify) except its declared failures
#: (``UprofError``: the LLM extractor's ``ExtractionError``, "the model server failed;
#: keep the capture"), which fail the batch at once and wait, as before
#: (docs/extractors.md, ``UPROF_LLM_FALLBACK=wait``). When every attempt failed, the
#: capture is quarantined and the pipeline goes on (``uprof.services.quarantine``;
#: decision "Poison captures are quarantined").
EXTRACTOR_CALL = RetryPolicy(
    attempts=3, on=(Exception,), never=(UprofError,), backoff=Backoff(0.05, 0.2)
)

#: The embedding model failed on a batch of memories: each memory is embedded on its
#: own, with this policy; one it fails on every time is projected without a vector
#: (``ProjectionRunner``), so one text the model cannot take does not stop projection.
EMBEDDING_CALL = RetryPolicy(
    attempts=3, on=(Exception,), never=(UprofError,), backoff=Backoff(0.05, 0.2)
)

#: A group of captures lost a subject to another process: drop the copies and redo the
#: group once; after that each capture goes alone, through SUBJECT_WRITE.
CAPTURE_GROUP = RetryPolicy(attempts=2, on=(VersionConflictError,))

#: A policy change lost to another process's change: re-stage it on top of theirs.
POLICY_CHANGE = RetryPolicy(attempts=3, on=(VersionConflictError,))

#: An audit append met another writer's lock or took indexes another writer just took.
#: Appends serialise behind one lock, so the waits are long and fixed (no jitter).
AUDIT_APPEND = RetryPolicy(
    attempts=30, on=(StoreBusyError, VersionConflictError), backoff=Backoff(0.005, 0.5)
)

#: Switching a SQLite database into WAL mode met another connection's write lock, which
#: SQLite answers at once instead of waiting (bug KA): the other is switching the same new
#: file, and once it has, the switch is a no-op. Short jittered waits, about 5 s in all.
WAL_SWITCH = RetryPolicy(
    attempts=100, on=(StoreBusyError,), backoff=Backoff(0.005, 0.1, jitter=True)
)

#: A read's inline pipeline run collided with the background worker on a position
#: (raised before anything is written): run the read again.
WORKER_COLLISION = RetryPolicy(attempts=3, on=(PositionMovedError,), backoff=Backoff(0.05, 0.05))

#: Recording a batch of served reads failed: the recorder thread tries four more times
#: before it stops and slices are refused. Any error counts: the recorder cannot tell a
#: lasting failure from a passing one, and an unrecorded read is never served.
READ_RECORDING = RetryPolicy(attempts=5, on=(Exception,), backoff=Backoff(0.05, 0.4))

#: A long-running worker's failed run (any error: it is logged, counted and shown by
#: readiness): wait, doubling from 0.5 s up to 30 s, and run again, until stopped; a
#: success resets the wait. The supervisors' loops wait on their stop event, so they
#: take only the back-off from here.
SUPERVISOR_BACKOFF = Backoff(0.5, 30.0)
