"""Capture requests the audit log does not name: recorded late, exactly once.

A capture request commits its events and keys, then appends its ``capture.accepted``
(decision 0072). A process killed between the two leaves stored captures that the log
never names. Two callers find such requests, and both write the entry here, through
``record_accepted_late`` (``reason_code`` recorded-late, ``once_by`` its
``notification_id``, decided under the log's write lock, so once across processes):

- a keyed retry answered from the stream (``CaptureService``, decision 0090), which
  knows the request exactly from its ``RequestsRecorded`` token;
- the extraction worker, after each batch it commits (``LateCaptures.reconcile``,
  decision 0101-capture-accepted-reconciled), for every request, keyed or not.

What the worker knows of a request is what the event log keeps: a request's captures are
consecutive versions of one stream saved in one transaction, so at consecutive
notification ids, its ``capture.accepted`` names the last one's id and their number. A
capture is on the log when an entry of its subject ends at or after it and counts back
over it. Missing captures are grouped into runs (consecutive ids, consecutive versions,
one stream); a run ends where the request ended (its last capture, which is what a keyed
retry names too: a keyed request's ``RequestsRecorded`` event follows its captures and
breaks the run), so both callers name the same ``notification_id``. A run is followed
into the next batches when it reaches its batch's end, and back into earlier ones when it
starts at its stream's first capture in the batch, so every worker names the whole
request whichever of its batches is checked first. Two unkeyed requests
of one subject saved in one group-commit transaction and both lost are one run: one
entry counting both (the log kept no boundary between them; nobody else can name them).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from eventsourcing.persistence import PersistenceError

from domain.errors import ConcurrencyConflictError, StoresLostError, UprofError
from domain.principal import acting_principal
from domain.profile import SubjectProfile
from uprof.crypto.mapper import DamagedEventError
from uprof.eventstore import CAPTURED_TOPIC
from uprof.ports import AuditStore, AuditTrail, EventStore
from uprof.retry import Backoff

_log = logging.getLogger(__name__)

#: ``reason_code`` of a ``capture.accepted`` appended after the request's own append was
#: lost (decisions 0090-capture-accepted-recorded-late, 0101-capture-accepted-reconciled).
RECORDED_LATE = "recorded-late"
ACCEPTED = "capture.accepted"
#: Captures read per look-ahead query when a missing run reaches the batch's end (and per
#: look-back query when it starts at the batch's first capture of its stream).
_LOOK_AHEAD = 64
#: Pages read at most behind a missing run that starts at its stream's first capture in
#: the batch: a lost request longer than this behind the batch is named from there on.
_LOOK_BACK_PAGES = 16
#: The wait before checking again after a check failed on a store that did not answer
#: (n failures in a row): 1 s, doubling, at most a minute.
_AFTER_FAILURE = Backoff(1.0, 60.0)
#: Captures kept waiting in memory at most (about 0.4 KB each): past it, the oldest
#: batches are let go from memory and read again from the event log when checked (the
#: check position is still before them), so no capture is dropped for the bound.
MAX_WAITING = 100_000
#: Captures read again at once from the log (what memory does not hold: after a restart,
#: another process's batches, past ``MAX_WAITING``), and pages of them checked at most
#: per ``check_due`` (the pipeline run goes on to projections).
_SPILLED_PAGE = 1_000
_SPILLED_PAGES_PER_CHECK = 10
#: Checks failed in a row on one batch before the next batch is checked to tell a store
#: not answering from a failure of the batch's own (which then drops it).
_OWN_FAILURE_AFTER = 3
#: The check positions' names: this prefix and the extraction position's name.
CHECK_ROW_PREFIX = "uprof.late-check:"


@dataclass(frozen=True)
class LateRequest:
    """What a ``capture.accepted`` names of one request (ids and counts; no text)."""

    subject_ref: str
    app_id: str
    agent_id: str
    purpose: str
    events: int
    notification_id: int
    principal: str | None = None
    #: The subject's tenant; None: the trail's own (a request of this deployment's tenant).
    tenant: str | None = None


def record_accepted_late(audit: AuditTrail, requests: Sequence[LateRequest]) -> None:
    """Append each request's ``capture.accepted`` with ``reason_code`` recorded-late,
    unless the log holds one of its subject with its ``notification_id`` (the request's
    own entry or an earlier late one): exactly once across processes (decision 0090)."""
    if not requests:
        return
    audit.record_many(
        [
            (
                ACCEPTED,
                {
                    "subject_ref": r.subject_ref,
                    "app_id": r.app_id,
                    "agent_id": r.agent_id,
                    "purpose": r.purpose,
                    "counts": {"events": r.events},
                    "notification_id": r.notification_id,
                    "principal": r.principal,
                    "tenant": r.tenant,
                    "reason_code": RECORDED_LATE,
                },
            )
            for r in requests
        ],
        once_by=("notification_id",),
    )


@dataclass(frozen=True)
class _Capture:
    """What the check keeps of one captured event: positions and the request's app,
    agent and purpose (None once its key is erased); never its text."""

    nid: int
    version: int
    stream: UUID
    at: datetime | None
    named: tuple[str, str, str] | None


def _capture(notification: Any, event: Any) -> _Capture:
    named = None
    if isinstance(event, SubjectProfile.InteractionCaptured):
        named = (event.app_id, event.agent_id, event.purpose)
    at = getattr(event, "timestamp", None)
    return _Capture(
        notification.id,
        notification.originator_version,
        event.originator_id,
        at if isinstance(at, datetime) else None,
        named,
    )


@dataclass
class _Batch:
    """Captures of one partition to check: those after ``start`` up to ``end`` (both log
    positions), from a committed batch kept in memory or read again from the log."""

    captures: list[_Capture]
    start: int
    end: int


@dataclass
class _Partition:
    """One extraction position this process follows, with its check position."""

    #: The extraction position's name, and the check position's (a row beside it).
    extraction: str
    row: str
    #: Whether a notification's subject (its originator id) is of this partition.
    mine: Callable[[Any], bool]
    #: Where the check position stands as this process last saw it (None: not read yet,
    #: or never started).
    checked: int | None = None
    #: The furthest extraction position this process knows of (read once, then each
    #: batch's end): captures up to it and after ``checked`` are to be checked.
    extracted_to: int = 0
    #: This process started the position (``begin``), or found it not started: read
    #: again only at this process's first batch of the partition.
    started: bool = False
    absent: bool = False
    #: Committed batches not yet checked, oldest first (bounded: ``max_waiting``).
    batches: deque[_Batch] = field(default_factory=deque)
    #: Where the batch whose check failed last starts, and how many times in a row.
    stuck: int | None = None
    stuck_failures: int = 0
    #: A page read after this position was too young to check until this time: not
    #: read again before (a page is decoded; another worker's batches wait the grace).
    young: tuple[int, datetime] | None = None


class LateCaptures:
    """The extraction worker's check that each request it extracted is on the audit log.

    Run after a batch's save commits (never inside it, never on the capture path). A
    batch is checked once its newest capture is ``grace_s`` old: a request whose process
    is alive appends its own entry a moment after its commit, and a late entry written
    before it would name the request twice. The one read on the common path is
    ``AuditStore.holding`` over the batch's subjects and capture positions. Entries go
    out as the pipeline's (no principal) with the subject's own tenant. Subjects erased
    since are skipped: their pseudonym is gone with them, and their erasure's entries are
    what the log says of their data (decision 0101-capture-accepted-reconciled).

    What is still to be checked is durable (decision 0112-late-check-durable): each
    extraction position has a check position beside it (``check_row``), and every
    capture of its partition after it, up to the extraction position, is still to be
    checked, whichever process extracted it. Batches in memory spare the log a read;
    what memory does not hold (after a restart, another process's batches, what went
    past the bound) is read again from the log, a page at a time. The position moves
    by compare-and-set once what precedes it is checked, so a process killed at any
    point leaves its unchecked captures to the next one that runs the partition."""

    def __init__(
        self,
        app: EventStore,
        log: AuditStore,
        audit: AuditTrail,
        subjects_of: Callable[[Iterable[str]], dict[str, tuple[str, str]]],
        *,
        grace_s: float,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._app = app
        self._log = log
        self._audit = audit
        #: stream id -> (tenant, pseudonym) of live subjects (``KeyStore.subjects_of_streams``).
        self._subjects_of = subjects_of
        self._grace = timedelta(seconds=grace_s)
        #: Wall clock, as the events' timestamps are (not the deployment's clock).
        self._now = now
        #: The extraction positions followed, by name (``follow``).
        self._parts: dict[str, _Partition] = {}
        self._lock = threading.Lock()
        #: One check at a time in this process (a second caller returns at once).
        self._checking = threading.Lock()
        #: Requests this process recorded late (a count for tests and telemetry).
        self.recorded = 0
        #: Checks that failed (``uprof_late_capture_check_failures_total``).
        self.failures = 0
        #: Captures dropped unchecked, each refused by the audit log or failing on its
        #: own (``uprof_late_captures_unchecked_total``).
        self.dropped = 0
        #: Captures kept waiting in memory at most (``MAX_WAITING``).
        self.max_waiting = MAX_WAITING
        self._failed_in_a_row = 0
        #: No check before this time (a check failed; None: none failing).
        self._retry_at: datetime | None = None

    @property
    def waiting(self) -> int:
        """Captures extracted and held in memory not yet checked: ``grace_s`` of them,
        more while checks fail (at most ``max_waiting``)."""
        with self._lock:
            return self._held_in_memory()

    def _held_in_memory(self) -> int:
        return sum(len(b.captures) for p in self._parts.values() for b in p.batches)

    @staticmethod
    def check_row(extraction: str) -> str:
        """The check position's name beside an extraction position's."""
        return f"{CHECK_ROW_PREFIX}{extraction}"

    def follow(self, extraction: str, mine: Callable[[Any], bool]) -> None:
        """Check the captures extracted at the position named ``extraction``; ``mine``
        tells a notification's originator id of that partition. The extraction worker
        calls it for each partition it runs."""
        with self._lock:
            if extraction not in self._parts:
                self._parts[extraction] = _Partition(extraction, self.check_row(extraction), mine)

    def begin(self, extraction: str, start: int) -> None:
        """Before a partition's first batch in this process (``start``: the position it
        starts from): start the check position there unless it has started (a database
        whose workers ran before check positions existed starts from its first batch
        since). A write once per partition and process; raises what the store raises."""
        part = self._parts[extraction]
        if part.started:
            return
        at = self._app.start_check_position(part.row, start)
        with self._lock:
            part.started, part.absent = True, False
            if part.checked is None:
                part.checked = at

    def extracted(
        self, captured: Sequence[tuple[Any, Any]], batch_end: int, *, extraction: str, start: int
    ) -> None:
        """A committed batch's ``(notification, event)`` captures of the partition named
        ``extraction``, read after ``start``: checked now if they are old enough, else by
        a later ``check_due``. ``batch_end``: the batch's last notification id (a run
        ending there may go on in the next batch). Never raises."""
        part = self._parts[extraction]
        spilled = 0
        with self._lock:
            part.extracted_to = max(part.extracted_to, batch_end)
            part.batches.append(_Batch([_capture(n, e) for n, e in captured], start, batch_end))
            # Bounded: past the bound (checks failing, or more captures than it within
            # the grace) the oldest batches are let go from memory: the check position
            # is still before them, so they are read again from the log when checked
            # (nothing is dropped for the bound: decision 0107).
            over = self._held_in_memory() - self.max_waiting
            while over > 0:
                fullest = max(self._parts.values(), key=lambda p: len(p.batches))
                if len(fullest.batches) <= 1:
                    break
                oldest = fullest.batches.popleft()
                over -= len(oldest.captures)
                spilled += len(oldest.captures)
        if spilled:
            _log.warning(
                "%d extracted captures past the bound of %d kept as positions only "
                "(read again when checked): checks have failed %d times in a row",
                spilled,
                self.max_waiting,
                self._failed_in_a_row,
            )
        self.check_due()

    def check_due(self) -> None:
        """Check, partition by partition, the captures after the check position whose
        newest is ``grace_s`` old, and move the position over them. Never raises: the
        extraction committed, so a check that fails on a store not answering (a driver
        error, a busy store) is tried again after a back-off (``failures`` counts it, a
        warning names its class); a declared refusal (another ``UprofError``) drops its
        batch, logged; a batch that keeps failing while the next one is checked fails
        for a reason of its own and is dropped, logged, so it holds no later check."""
        now = self._now()
        with self._lock:
            if self._retry_at is not None and now < self._retry_at:
                return
        if not self._checking.acquire(blocking=False):
            return  # another thread of this process is checking
        token = acting_principal.set(None)  # the pipeline's entry, whoever drives it
        try:
            pages = [0]
            for part in list(self._parts.values()):
                try:
                    self._check_partition(part, now - self._grace, pages)
                except Exception as error:  # the worker goes on; counted and logged
                    self._failed(error, now)
                    return
        finally:
            acting_principal.reset(token)
            self._checking.release()

    def _check_partition(self, part: _Partition, horizon: datetime, pages: list[int]) -> None:
        if part.checked is None:
            if part.absent:
                return
            at = self._app.check_position(part.row)
            if at is None:
                # Not started: nothing extracted since check positions exist (or another
                # process started it since: this one's first batch of it reads it).
                part.absent = True
                return
            extracted_to = self._app.tracking_position(part.extraction)
            with self._lock:
                part.checked = at
                part.extracted_to = max(part.extracted_to, extracted_to)
        start = moved = part.checked
        try:
            while True:
                batch = self._next(part, moved, horizon, pages)
                if batch is None:
                    return
                try:
                    self._check(batch)
                except Exception as error:
                    if not self._set_aside(part, batch, error, horizon, pages):
                        raise
                moved = batch.end
                self._passed(part, moved)
        finally:
            if moved != start:
                self._move(part, start, moved)

    def _check(self, batch: _Batch) -> bool:
        """Check a batch; whether the audit store was asked (False: nothing of it was
        left to ask, its subjects erased since)."""
        return bool(batch.captures) and self._reconcile(batch.captures, batch.end)

    def _set_aside(
        self,
        part: _Partition,
        batch: _Batch,
        error: BaseException,
        horizon: datetime,
        pages: list[int],
    ) -> bool:
        """Whether a batch whose check raised ``error`` is dropped (True) or kept for a
        later check (False: ``error`` is then the check's failure). A store's failure
        (``_of_a_store``) is never the batch's own, however long it lasts: kept. A
        declared refusal is dropped at once; any other error is a store not answering,
        unless it keeps failing while the next batch is checked and that check asked the
        store: then it fails for a reason of its own (review of 0112: a store that reads
        but does not write failed only the batch that had a lost request to write, and a
        next batch of erased subjects passed without asking the store; both dropped the
        lost request)."""
        if _of_a_store(error):
            return False
        declared = isinstance(error, UprofError)
        if not declared:
            with self._lock:
                if part.stuck == batch.start:
                    part.stuck_failures += 1
                else:
                    part.stuck, part.stuck_failures = batch.start, 1
                failures = part.stuck_failures
            if failures < _OWN_FAILURE_AFTER:
                return False
            # The next batch answers the question: checked, the store answers.
            probe = self._next(part, batch.end, horizon, pages)
            if probe is None:
                return False
            if not self._check(probe):  # raises: the store does not answer (backing off)
                return False  # the store was not asked: no answer to the question
            try:
                self._check(batch)  # once more, the store answering
                return True  # the store was back: checked after all
            except Exception as again:
                if _of_a_store(again):
                    return False  # the store failed this time: not the batch's own
                error = again
        with self._lock:
            self.dropped += len(batch.captures)
            part.stuck, part.stuck_failures = None, 0
        _log.error(
            "could not check %d captures against the audit log (%s; log positions %d to "
            "%d): dropped",
            len(batch.captures),
            type(error).__name__,
            batch.start + 1,
            batch.end,
        )
        return True

    def _next(
        self, part: _Partition, after: int, horizon: datetime, pages: list[int]
    ) -> _Batch | None:
        """The partition's next captures to check after position ``after``, if their
        newest is ``grace_s`` old: the batch in memory that starts there, else a page of
        the log up to the next batch in memory (or to the furthest extraction position
        known). None: nothing due. Raises what the event store raises."""
        with self._lock:
            head = next((b for b in part.batches if b.end > after), None)
            bound = part.extracted_to if head is None else head.start
        if head is not None and head.start <= after:
            return head if _older(head.captures, horizon) else None
        if bound <= after:
            return None
        if part.young is not None and part.young[0] == after and horizon < part.young[1]:
            return None  # read already: not old enough yet
        # Not in memory: read again from the log (after a restart, another process's
        # batches, or what went past the bound).
        pages[0] += 1
        if pages[0] > _SPILLED_PAGES_PER_CHECK:
            return None  # the rest at the next run
        read = self._app.notifications_after(after, _SPILLED_PAGE, topics=(CAPTURED_TOPIC,))
        if len(read) < _SPILLED_PAGE or read[-1].id >= bound:
            end = bound
        else:
            end = read[-1].id
        page = [n for n in read if n.id <= end and part.mine(n.originator_id)]
        captures = [self._decoded(n) for n in page]
        if not _older(captures, horizon):
            newest = max(c.at for c in captures if c.at is not None)
            with self._lock:
                part.young = (after, newest)
            return None
        return _Batch(captures, after, end)

    def _passed(self, part: _Partition, moved: int) -> None:
        """Checked up to ``moved``: the batches in memory before it go."""
        with self._lock:
            while part.batches and part.batches[0].end <= moved:
                part.batches.popleft()
            if part.stuck is not None and part.stuck < moved:
                part.stuck, part.stuck_failures = None, 0
            self._failed_in_a_row = 0
            self._retry_at = None

    def _move(self, part: _Partition, start: int, moved: int) -> None:
        """Save the check position (compare-and-set from where this process last saw it);
        moved by another process meanwhile, it is read again at the next check. A failed
        save is a check failed on a store not answering: what was checked is checked
        again (writing nothing: ``once_by``)."""
        if self._app.move_check_position(part.row, start, moved):
            with self._lock:
                part.checked = moved
        else:
            with self._lock:
                part.checked = None

    def _decoded(self, notification: Any) -> _Capture:
        """A capture read again from the log. A damaged one (its stored bytes fail
        authentication; the extraction worker set it aside, decision
        0124-damaged-events-quarantined) is kept by its positions only, as a shredded
        one is: its entry on the log is found by position, and a lost request that only
        it could name is not named (its app, agent and purpose are in the ciphertext).
        Reading it failed every check of the partition, in every process but the one
        that extracted it (bug DB)."""
        try:
            return _capture(notification, self._app.decode(notification))
        except DamagedEventError:
            return _Capture(
                notification.id,
                notification.originator_version,
                notification.originator_id,
                None,
                None,
            )

    def _failed(self, error: BaseException, now: datetime) -> None:
        """A check failed on a store not answering: the check position stays, what is
        after it is checked again after the back-off."""
        with self._lock:
            self.failures += 1
            self._failed_in_a_row += 1
            wait_s = _AFTER_FAILURE.bound_s(self._failed_in_a_row)
            self._retry_at = now + timedelta(seconds=wait_s)
            in_a_row, waiting = self._failed_in_a_row, self._held_in_memory()
        _log.warning(
            "could not check extracted captures against the audit log (%s; %d times in a "
            "row); %d captures wait, checked again in %.0f s",
            type(error).__name__,
            in_a_row,
            waiting,
            wait_s,
        )

    def _reconcile(self, captured: Sequence[_Capture], batch_end: int) -> bool:
        """Name the lost requests among ``captured``; whether the audit store was asked
        (False: every subject erased since)."""
        by_stream: dict[UUID, list[_Capture]] = {}
        for capture in captured:
            by_stream.setdefault(capture.stream, []).append(capture)
        subjects = self._subjects_of(str(s) for s in by_stream)
        live = {s: c for s, c in by_stream.items() if str(s) in subjects}
        if not live:
            return False
        refs = {s: subjects[str(s)][1] for s in live}
        held = self._held(refs, live)
        requests = []
        for stream, captures in live.items():
            lost = [c for c in captures if c.version not in held.get(stream, set())]
            if not lost:
                continue
            tenant, pseudonym = subjects[str(stream)]
            first = min(c.nid for c in captures)
            for run in _runs(lost):
                if run[-1].nid == batch_end:
                    run = self._run_on(stream, pseudonym, run)
                    if not run:
                        continue
                if run[0].nid == first:
                    run = self._run_back(stream, pseudonym, run)
                named = next((c.named for c in run if c.named is not None), None)
                if named is None:  # every capture of it erased since: its erasure says so
                    continue
                requests.append(
                    LateRequest(
                        subject_ref=pseudonym,
                        app_id=named[0],
                        agent_id=named[1],
                        purpose=named[2],
                        events=len(run),
                        notification_id=run[-1].nid,
                        tenant=tenant,
                    )
                )
        if requests:
            record_accepted_late(self._audit, requests)
            self.recorded += len(requests)
            _log.warning(
                "%d capture requests were not on the audit log (a process died between "
                "their commit and their audit append): recorded late",
                len(requests),
            )
        return True

    def _held(
        self, refs: dict[UUID, str], captures: dict[UUID, list[_Capture]]
    ) -> dict[UUID, set[int]]:
        """The versions, per stream, of the captures an entry on the log names: one read
        of the subjects' ``capture.accepted`` entries ending at one of these positions."""
        versions = {s: {c.nid: c.version for c in cs} for s, cs in captures.items()}
        stream_of = {ref: s for s, ref in refs.items()}
        held: dict[UUID, set[int]] = {}
        entries = self._log.holding(
            ACCEPTED,
            refs.values(),
            "notification_id",
            [c.nid for cs in captures.values() for c in cs],
        )
        for entry in entries:
            stream = stream_of.get(entry.get("subject_ref", ""))
            if stream is None:
                continue
            last = versions[stream].get(entry["notification_id"])
            events = entry.get("counts", {}).get("events", 1)
            if last is not None:
                held.setdefault(stream, set()).update(range(last - events + 1, last + 1))
        return held

    def _run_on(self, stream: UUID, pseudonym: str, run: list[_Capture]) -> list[_Capture]:
        """A missing run that reaches the batch's end, with the captures of the same
        request in the next batches: the following positions while they are the
        stream's next versions and ``grace_s`` old, up to the first capture an entry
        names (an entry ending ahead names the request cut by the batch's end, or the
        next one). [] when the run is such a request, on the log. Costs a look-ahead
        read and an audit read, for a batch that cuts a request (one per batch at most
        per partition) or holds a lost one."""
        ahead: list[_Capture] = []
        notifications: dict[int, Any] = {}
        held: set[int] = set()
        # Page by page, until a page holds the end of a request on the log (an entry
        # counting back over what came before it) or the stream's run of positions ends:
        # a subject written back to back would otherwise be read to the log's head.
        while not held:
            more = self._app.notifications_after(
                (ahead or run)[-1].nid, _LOOK_AHEAD, topics=(CAPTURED_TOPIC,)
            )
            page: list[_Capture] = []
            for n in more:
                last = (page or ahead or run)[-1]
                if (
                    n.id != last.nid + 1
                    or n.originator_id != stream
                    or n.originator_version != last.version + 1
                ):
                    break
                # Not decoded yet: a request on the log (the common case) needs positions only.
                page.append(_Capture(n.id, n.originator_version, stream, None, None))
                notifications[n.id] = n
            if not page:
                break
            # An entry ending in the page counts back over the captures it names, in the
            # batch too (a request cut by the batch's end).
            ends = self._held({stream: pseudonym}, {stream: page})
            ahead.extend(page)
            held = ends.get(stream, set())
            if len(page) < len(more) or len(more) < _LOOK_AHEAD:
                break
        if not ahead:
            return run
        joined = [*run, *ahead]
        lost: list[_Capture] = []
        horizon = self._now() - self._grace
        for capture in joined:
            if capture.version in held:
                break
            if capture.nid in notifications:  # ahead: decoded only for a lost request
                n = notifications[capture.nid]
                capture = self._decoded(n)
                if not _older([capture], horizon):
                    break  # a request too young to judge: its own batch will
            lost.append(capture)
        return lost

    def _run_back(self, stream: UUID, pseudonym: str, run: list[_Capture]) -> list[_Capture]:
        """A missing run that starts at its stream's first capture in the batch, with the
        captures of the same request in earlier batches: the preceding positions while
        they are the stream's previous versions, back to the first capture an entry names
        (an entry ending there names the request before), at most ``_LOOK_BACK_PAGES``
        pages. Every worker then names the same whole request, whichever batch of it is
        checked first (two workers: the batch holding a request's end may be checked
        before the one holding its start). Costs a read for a lost run only."""
        behind: list[_Capture] = []  # newest first
        notifications: dict[int, Any] = {}
        held: set[int] = set()
        earliest = run[0]
        for _ in range(_LOOK_BACK_PAGES):
            start = max(0, earliest.nid - 1 - _LOOK_AHEAD)
            if start >= earliest.nid - 1:
                break
            # The topic filter may skip positions: what comes at or after ``earliest``
            # is not behind it.
            more = [
                n
                for n in self._app.notifications_after(
                    start, earliest.nid - 1 - start, topics=(CAPTURED_TOPIC,)
                )
                if n.id < earliest.nid
            ]
            page: list[_Capture] = []
            for n in reversed(more):
                if (
                    n.id != earliest.nid - 1
                    or n.originator_id != stream
                    or n.originator_version != earliest.version - 1
                ):
                    break
                earliest = _Capture(n.id, n.originator_version, stream, None, None)
                page.append(earliest)
                notifications[n.id] = n
            if not page:
                break
            behind.extend(page)
            # An entry ending in the page counts back over the request it names.
            held = self._held({stream: pseudonym}, {stream: page}).get(stream, set())
            if held or earliest.nid - 1 > start or start == 0:
                break
        lost: list[_Capture] = []
        for capture in behind:
            if capture.version in held:
                break
            n = notifications[capture.nid]  # decoded only for a lost request
            lost.append(self._decoded(n))
        return [*reversed(lost), *run]


#: What a store raises when it does not answer (or answers busy): drivers' errors as
#: SQLAlchemy, eventsourcing and the drivers themselves raise them, the file system's,
#: time-outs, a busy store or a lost hold on the stores (``StoresLostError``).
_STORE_ERRORS: tuple[type[BaseException], ...] = (
    sa.exc.SQLAlchemyError,
    PersistenceError,
    sqlite3.Error,
    OSError,
    TimeoutError,
    ConcurrencyConflictError,
    StoresLostError,
)


def _of_a_store(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is a store not answering: a driver's error
    (psycopg's too, told by module, as a SQLite-only deployment may not import it)."""
    seen: set[int] = set()
    at: BaseException | None = error
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        if isinstance(at, _STORE_ERRORS) or any(
            c.__module__.split(".")[0] in ("psycopg", "psycopg_pool") for c in type(at).__mro__
        ):
            return True
        at = at.__cause__ or at.__context__
    return False


def _older(captures: Sequence[_Capture], horizon: datetime) -> bool:
    return all(c.at is None or c.at <= horizon for c in captures)


def _runs(captures: Sequence[_Capture]) -> list[list[_Capture]]:
    """Missing captures of one stream grouped by request: consecutive notification ids
    and consecutive versions (one transaction, one subject)."""
    runs: list[list[_Capture]] = []
    for capture in sorted(captures, key=lambda c: c.nid):
        if runs and (
            capture.nid == runs[-1][-1].nid + 1 and capture.version == runs[-1][-1].version + 1
        ):
            runs[-1].append(capture)
        else:
            runs.append([capture])
    return runs
