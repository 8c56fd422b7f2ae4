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
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from domain.errors import ConcurrencyConflictError, UprofError
from domain.principal import acting_principal
from domain.profile import SubjectProfile
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
#: Captures kept waiting at most while checks keep failing (about 0.4 KB each): past it,
#: the oldest batches keep only their positions (one range for all of them, read again
#: from the event log when checked), so no capture is dropped for the bound.
MAX_WAITING = 100_000
#: Captures read again at once from the positions kept past ``MAX_WAITING``, and pages
#: of them checked at most per ``check_due`` (the pipeline run goes on to projections).
_SPILLED_PAGE = 1_000
_SPILLED_PAGES_PER_CHECK = 10


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


class LateCaptures:
    """The extraction worker's check that each request it extracted is on the audit log.

    Run after a batch's save commits (never inside it, never on the capture path). A
    batch is checked once its newest capture is ``grace_s`` old: a request whose process
    is alive appends its own entry a moment after its commit, and a late entry written
    before it would name the request twice. The one read on the common path is
    ``AuditStore.holding`` over the batch's subjects and capture positions. Entries go
    out as the pipeline's (no principal) with the subject's own tenant. Subjects erased
    since are skipped: their pseudonym is gone with them, and their erasure's entries are
    what the log says of their data (decision 0101-capture-accepted-reconciled)."""

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
        #: Committed batches not yet checked: (captures, the batch's last notification id).
        self._waiting: deque[tuple[list[_Capture], int]] = deque()
        self._lock = threading.Lock()
        #: Requests this process recorded late (a count for tests and telemetry).
        self.recorded = 0
        #: Checks that failed (``uprof_late_capture_check_failures_total``).
        self.failures = 0
        #: Captures dropped unchecked, each refused by the audit log
        #: (``uprof_late_captures_unchecked_total``).
        self.dropped = 0
        #: Captures kept waiting at most (``MAX_WAITING``).
        self.max_waiting = MAX_WAITING
        #: Batches past ``max_waiting`` while checks fail, kept as their positions only:
        #: the captures after the first and up to the second (None: none).
        self._spilled: tuple[int, int] | None = None
        self._failed_in_a_row = 0
        #: No check before this time (a check failed; None: none failing).
        self._retry_at: datetime | None = None

    @property
    def waiting(self) -> int:
        """Captures extracted and not yet checked: ``grace_s`` of them, more while checks
        fail (at most ``max_waiting``)."""
        return sum(len(c) for c, _ in self._waiting)

    def extracted(self, captured: Sequence[tuple[Any, Any]], batch_end: int) -> None:
        """A committed batch's ``(notification, event)`` captures: checked now if they are
        old enough, else by a later ``check_due``. ``batch_end``: the batch's last
        notification id (a run ending there may go on in the next batch). Never raises."""
        if captured:
            with self._lock:
                self._waiting.append(([_capture(n, e) for n, e in captured], batch_end))
                # Bounded while checks fail (and until what they left is checked): else
                # the grace bounds it. Past the bound
                # the oldest batches keep their positions only (read again when checked):
                # dropping them would lose the very requests an outage of the audit store
                # leaves off the log, to anyone who captures enough meanwhile.
                bounded = self._failed_in_a_row or self._spilled is not None
                over = self.waiting - self.max_waiting if bounded else 0
                spilled = 0
                while over > 0 and len(self._waiting) > 1:
                    oldest, end = self._waiting.popleft()
                    over -= len(oldest)
                    spilled += len(oldest)
                    after = min(c.nid for c in oldest) - 1
                    if self._spilled is not None:
                        after, end = min(after, self._spilled[0]), max(end, self._spilled[1])
                    self._spilled = (after, end)
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
        """Check the waiting batches whose newest capture is ``grace_s`` old. Never raises:
        the extraction committed, and this check is the batch's only one, so a check that
        fails on a store not answering (a driver error, a busy store) keeps its batch and
        is tried again after a back-off (``failures`` counts it, a warning names its
        class); only a declared refusal (another ``UprofError``) drops the batch, logged."""
        now = self._now()
        horizon = now - self._grace
        pages = 0
        while True:
            with self._lock:
                if self._retry_at is not None and now < self._retry_at:
                    return
                spilled = self._spilled
                if spilled is None and (
                    not self._waiting or not _older(self._waiting[0][0], horizon)
                ):
                    return
                batch = self._waiting[0] if spilled is None else None
                paged = spilled is not None
            token = acting_principal.set(None)  # the pipeline's entry, whoever drives it
            try:
                if batch is None:
                    # The oldest captures, kept as positions: one page of them read again.
                    pages += 1
                    if pages > _SPILLED_PAGES_PER_CHECK:
                        return  # the rest at the next run
                    batch = self._read_spilled(horizon)
                    if batch is None:
                        if self._spilled is None:  # none left: the waiting batches' turn
                            continue
                        return  # not grace_s old yet
                self._reconcile(*batch)
            except Exception as error:  # the worker goes on; counted and logged
                if (
                    batch is not None
                    and isinstance(error, UprofError)
                    and not isinstance(error, ConcurrencyConflictError)
                ):
                    self._done(batch, dropped=True, paged=paged)
                    _log.error(
                        "could not check %d captures against the audit log (%s): dropped",
                        len(batch[0]),
                        type(error).__name__,
                    )
                    continue
                self._failed(error, now)
                return
            finally:
                acting_principal.reset(token)
            self._done(batch, paged=paged)

    def _done(
        self, batch: tuple[list[_Capture], int], *, dropped: bool = False, paged: bool = False
    ) -> None:
        """The batch at the head is checked (or dropped): the next one's turn."""
        with self._lock:
            if not paged and self._waiting and self._waiting[0] is batch:
                self._waiting.popleft()
            elif paged and self._spilled is not None:
                # A page of the spilled positions: what is left starts after it.
                after = max(self._spilled[0], batch[1])
                self._spilled = None if after >= self._spilled[1] else (after, self._spilled[1])
            if dropped:
                self.dropped += len(batch[0])
            self._failed_in_a_row = 0
            self._retry_at = None

    def _read_spilled(self, horizon: datetime) -> tuple[list[_Capture], int] | None:
        """The next page of the captures kept as positions, as a batch to check (its end:
        the page's last position); None when what is left is not ``grace_s`` old yet, or
        nothing is left. Raises what the event store raises (a failed check)."""
        spilled = self._spilled
        if spilled is None:
            return None
        after, end = spilled
        page = [
            n
            for n in self._app.notifications_after(after, _SPILLED_PAGE, topics=(CAPTURED_TOPIC,))
            if n.id <= end
        ]
        if not page:
            with self._lock:
                if self._spilled == spilled:
                    self._spilled = None
            return None
        captures = [_capture(n, self._app.decode(n)) for n in page]
        if not _older(captures, horizon):
            return None
        return captures, page[-1].id

    def _failed(self, error: BaseException, now: datetime) -> None:
        """A check failed on a store not answering: its batch stays first, checked again
        after the back-off."""
        with self._lock:
            self.failures += 1
            self._failed_in_a_row += 1
            wait_s = _AFTER_FAILURE.bound_s(self._failed_in_a_row)
            self._retry_at = now + timedelta(seconds=wait_s)
            in_a_row, waiting = self._failed_in_a_row, self.waiting
        _log.warning(
            "could not check extracted captures against the audit log (%s; %d times in a "
            "row); %d captures wait, checked again in %.0f s",
            type(error).__name__,
            in_a_row,
            waiting,
            wait_s,
        )

    def _reconcile(self, captured: Sequence[_Capture], batch_end: int) -> None:
        by_stream: dict[UUID, list[_Capture]] = {}
        for capture in captured:
            by_stream.setdefault(capture.stream, []).append(capture)
        subjects = self._subjects_of(str(s) for s in by_stream)
        live = {s: c for s, c in by_stream.items() if str(s) in subjects}
        if not live:
            return
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
                capture = _capture(n, self._app.decode(n))
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
            lost.append(_capture(n, self._app.decode(n)))
        return [*reversed(lost), *run]


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
