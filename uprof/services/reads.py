"""Record every served slice: a ``SliceServed`` event on the subject's stream and an
audit entry, written in the request (``sync``) or by one recorder thread (``async``).

Why a recorder: recording costs more than serving (a subject save, an audit append,
two commits), and nothing the caller gets back depends on it. In ``async`` mode the
request hands its read to a bounded queue and returns; the recorder writes what has
queued up as one save per subject and one audit append, so a burst of reads costs a
few commits, not one pair each. The trade-off is stated in
docs/decisions/0007-read-path.md: a crash can lose the reads served in the
last write window (records are written as soon as the recorder is free, so the
window is one write long); a capture or consent change is never deferred.

Fail closed: a read that cannot be queued (backlog full for ``put_timeout_s``) or
that arrives after the recorder gave up raises ``ReadRecordingError`` and the slice
is not served. Readers of what was recorded (the privacy center's "who read it",
audit exports, erasure) call ``drain()`` first, so within one process they always
see every read served before them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from audit.entry import validate_entry
from audit.errors import AuditEntryError
from domain.errors import (
    InvalidInputError,
    ReadRecordingError,
    SubjectErasedError,
    SubjectNotFoundError,
)
from domain.profile import SubjectProfile
from uprof import retry
from uprof.caching import BoundedCache
from uprof.ports import AuditTrail, EventStore

log = logging.getLogger(__name__)

MODES = ("sync", "async")
#: Queued by drain() to end the recorder's linger at once, and by close() to end its wait
#: for work; never written, never counted.
_FLUSH: Any = object()
#: Subjects whose last saved state the recorder keeps to save the next reads on.
MAX_SAVED_SUBJECTS = 256


@dataclass(frozen=True)
class ServedRead:
    """Who read which items of which subject, for what, when."""

    stream_id: UUID
    pseudonym: str
    app_id: str
    agent_id: str
    purpose: str
    item_ids: tuple[str, ...]
    served_at: datetime
    budget_tokens: int
    n_tokens: int
    #: The authenticated principal that asked (its audit label), when known.
    principal: str = ""


class ReadRecorder:
    def __init__(
        self,
        app: EventStore,
        audit: AuditTrail,
        *,
        mode: str = "async",
        max_pending: int = 10_000,
        max_batch: int = 500,
        linger_s: float = 0.05,
        put_timeout_s: float = 5.0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"read recording mode must be one of {MODES}, not {mode!r}")
        self._app = app
        self._audit = audit
        self.mode = mode
        self._max_batch = max_batch
        self._linger_s = linger_s
        self._put_timeout_s = put_timeout_s
        #: The last saved state of recently read subjects: the recorder is most of their
        #: writers, so the next batch usually saves on top of it without a reload (a
        #: stale copy loses the version check and is reloaded; see _save_reads).
        self._saved: BoundedCache[UUID, SubjectProfile] = BoundedCache(
            MAX_SAVED_SUBJECTS, name="recorder-saved-subjects"
        )
        self._queue: queue.Queue[ServedRead] = queue.Queue(maxsize=max_pending)
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._stopping = threading.Event()
        self._failure: BaseException | None = None
        self.recorded = 0
        #: Reads queued so far and reads written (or given up on) so far. The queue is
        #: FIFO and a read is counted in the same critical section as it is queued, so
        #: "written >= queued at the time I asked" means "every read before me is written".
        self._counts = threading.Lock()
        self._queued = 0
        self._settled = 0

    # ---------------------------------------------------------------- writers

    def record(self, read: ServedRead) -> None:
        """Record one served read (now, or queued for the recorder thread).

        A read whose audit entry the log would refuse is refused here, before it is
        served (``InvalidInputError``): queued, it was refused by the recorder after its
        retries, and the recorder gave up for every read of the process (review of 0138,
        bug HP: a slice of more than 1,000 items)."""
        check_recordable(read)
        if self.mode == "sync":
            self._write([read])
            return
        self._raise_if_failed()
        self._start()
        deadline = time.monotonic() + self._put_timeout_s
        while True:
            with self._counts:
                try:
                    self._queue.put_nowait(read)
                except queue.Full:
                    pass
                else:
                    self._queued += 1
                    return
            if time.monotonic() >= deadline:
                raise ReadRecordingError(
                    "the read log is backed up; the slice is refused rather than served unrecorded"
                )
            time.sleep(0.001)

    def forget(self, stream_id: UUID) -> None:
        """Drop the subject's saved state (erasure calls this: it holds decrypted content)."""
        self._saved.pop(stream_id)

    def drain(self, timeout_s: float = 30.0) -> None:
        """Wait until every read queued before this call is written (or raise
        ReadRecordingError). Reads queued meanwhile do not hold it up: under a steady
        stream of reads the queue is never empty, and a drain must still end."""
        if self.mode == "sync":
            return
        with self._counts:
            target = self._queued
        deadline = time.monotonic() + timeout_s
        if self._settled < target:
            try:
                self._queue.put_nowait(_FLUSH)  # uncounted: it only ends a linger
            except queue.Full:
                pass  # a full queue is written in full batches, with no linger to cut
        while self._settled < target:
            self._raise_if_failed()
            if time.monotonic() >= deadline:
                raise ReadRecordingError("timed out waiting for the read log to be written")
            time.sleep(0.002)
        self._raise_if_failed()

    def close(self) -> None:
        """Write what is queued, then stop the recorder thread."""
        if self._thread is None:
            return
        try:
            self.drain()
        finally:
            self._stopping.set()
            try:  # wake the recorder now, not at the end of its 0.2 s wait for work
                self._queue.put_nowait(_FLUSH)
            except queue.Full:
                pass  # it is writing, and sees _stopping before its next wait
            self._thread.join(timeout=5)
            self._thread = None

    @property
    def pending(self) -> int:
        return self._queued - self._settled

    @property
    def healthy(self) -> bool:
        return self._failure is None

    # ---------------------------------------------------------------- recorder

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise ReadRecordingError(
                f"reads cannot be recorded ({type(self._failure).__name__}); slices are refused"
            )

    def _start(self) -> None:
        if self._thread is not None:
            return
        with self._start_lock:
            if self._thread is None:
                self._stopping.clear()
                self._thread = threading.Thread(
                    target=self._run, name="uprof-read-recorder", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                first = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if first is _FLUSH:
                continue  # a drain asked, and nothing is waiting to be written
            # Linger briefly so a burst of reads shares one save and one audit append
            # (group commit): the recorder then takes a small share of the CPU that
            # serving needs, at the price of a window of at most linger_s + one write.
            # A drain() cuts the linger short (it queues _FLUSH): its caller is waiting.
            batch: list[ServedRead] = [first]
            deadline = time.monotonic() + self._linger_s
            while len(batch) < self._max_batch:
                try:
                    item = self._queue.get(timeout=max(deadline - time.monotonic(), 0.0))
                except queue.Empty:
                    break
                if item is _FLUSH:
                    break
                batch.append(item)
            try:
                self._write_with_retries(batch)
            except BaseException as e:
                log.exception("read recorder gave up; slices are refused until restart")
                self._failure = e
            finally:
                with self._counts:
                    self._settled += len(batch)
            if self._failure is not None:
                self._discard_queued()
                return

    def _discard_queued(self) -> None:
        """After a failure nothing more is written; release waiters on queued reads."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _FLUSH:
                with self._counts:
                    self._settled += 1

    def _write_with_retries(self, batch: Sequence[ServedRead]) -> None:
        def failed(error: BaseException) -> None:
            log.warning("recording %d reads failed; retrying", len(batch), exc_info=error)

        retry.READ_RECORDING.call(lambda: self._write(batch), before_retry=failed)

    def _write(self, batch: Sequence[ServedRead]) -> None:
        """One save per subject (all its reads), then one audit append for the batch.

        Retrying a batch may record a subject's reads twice if the audit append
        failed after the save; that over-counts heat, never hides a read.
        """
        by_stream: dict[UUID, list[ServedRead]] = defaultdict(list)
        for read in batch:
            by_stream[read.stream_id].append(read)
        for stream_id, reads in by_stream.items():
            self._save_reads(stream_id, reads)
        self._audit.record_many([(_ACTION, _audit_fields(read)) for read in batch])
        self.recorded += len(batch)

    def _save_reads(self, stream_id: UUID, reads: Sequence[ServedRead]) -> None:
        def command() -> None:
            # A copy that is behind fails the save's version check, is dropped, and the
            # retry loads the subject afresh (which also sees an erasure).
            # Taken out, so a failed save below does not leave it cached.
            profile = self._saved.take(stream_id)
            ticket = self._saved.ticket()
            if profile is None:
                profile = self._app.load(stream_id)
            for read in reads:
                profile.record_slice_served(
                    app_id=read.app_id,
                    agent_id=read.agent_id,
                    purpose=read.purpose,
                    item_ids=list(read.item_ids),
                    served_at=read.served_at,
                    budget_tokens=read.budget_tokens,
                    n_tokens=read.n_tokens,
                )
            self._app.save(profile)
            # Not cached when the subject was forgotten (erased) since the load began.
            self._saved.put(stream_id, profile, ticket=ticket)

        try:
            self._app.with_retry(command, subject=stream_id)
        except (SubjectErasedError, SubjectNotFoundError):
            # Erased between serving and recording: its stream takes no more events;
            # the audit entry (pseudonym and ids only) still records that the read happened.
            pass


_ACTION = "slice.served"
#: The request field to name when an audit field of a read is refused: the items and the
#: counts of a slice follow from its budget.
_REQUEST_FIELD = {"item_refs": "budget_tokens", "counts": "budget_tokens"}


def _audit_fields(read: ServedRead) -> dict[str, Any]:
    """The fields of a read's audit entry (the log adds its tenant and time)."""
    return {
        "subject_ref": read.pseudonym,
        "principal": read.principal or None,
        "app_id": read.app_id,
        "agent_id": read.agent_id,
        "purpose": read.purpose,
        "occurred_at": read.served_at.isoformat(),
        "item_refs": list(read.item_ids),
        "counts": {"tokens": read.n_tokens, "budget": read.budget_tokens},
    }


def check_recordable(read: ServedRead) -> None:
    """Refuse a read whose audit entry the log would refuse (``InvalidInputError`` naming
    the request field to blame), so that it is not served: a read that cannot be audited
    is not served, and it must not stop the recorder for everyone else's reads."""
    fields = {name: value for name, value in _audit_fields(read).items() if value is not None}
    try:
        validate_entry({"action": _ACTION, **fields})
    except AuditEntryError:
        pass
    else:
        return
    for name, value in fields.items():  # which field: named to the caller
        try:
            validate_entry({"action": _ACTION, name: value})
        except AuditEntryError as refused:
            more = (
                f" (it would list {len(read.item_ids)} items; ask a smaller budget_tokens)"
                if name == "item_refs"
                else ""
            )
            raise InvalidInputError(
                f"this read cannot be recorded, so it is not served: {refused}{more}",
                field=_REQUEST_FIELD.get(name, name),
            ) from None
