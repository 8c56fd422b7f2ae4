"""Quarantine: a capture whose extraction fails on every attempt is set aside, not retried
for ever, and the pipeline goes on with the captures after it.

Everything about it is here except the two steps that must sit in the extraction batch
(``uprof.services.extraction``): the bounded attempts (``retry.EXTRACTOR_CALL``) and the
``CaptureQuarantined`` event, saved with the batch's guarded position, so that however
many workers read the capture, one verdict is recorded, once (decision
"Poison captures are quarantined").

- **Record.** After the batch commits, ``recorded`` writes a ``capture.quarantined``
  audit entry (the subject's pseudonym, the capture's id, the stage and the error's class
  as ``reason_code``, the attempts), once per capture whoever writes it (``once_by``),
  and one log line with the same ids. Never the error's message: an extractor's message
  may quote the capture. A worker killed between the commit and the append leaves the
  entry to the next listing, which writes the entries the log lacks.
- **List.** ``QuarantineIndex`` folds the log's quarantine events (read after the
  position it last read, so a caller pays for what is new) with the erasure tombstones;
  captures and subjects the erasure ledger names are left out, so an erasure removes
  them from the list at once, in every process. The events themselves are sealed under
  the capture's own key (they cite it as evidence): erasing the capture or the subject
  shreds them.
- **Retry.** ``retry`` extracts a quarantined capture again (the same bounded attempts),
  and on success saves its results with ``CaptureReleased`` in one save of the subject's
  stream: two retries at once, in any processes, release it once (the second finds it no
  longer quarantined). Still failing, it stays quarantined.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from eventsourcing.utils import get_topic

from domain.principal import acting_principal
from domain.profile import SubjectProfile
from uprof import retry
from uprof.crypto.mapper import DamagedEventError
from uprof.ports import AuditTrail, EventStore

if TYPE_CHECKING:
    from uprof.crypto.ledger import LedgerState

_log = logging.getLogger(__name__)

QUARANTINED_TOPIC = get_topic(SubjectProfile.CaptureQuarantined)
RELEASED_TOPIC = get_topic(SubjectProfile.CaptureReleased)
CAPTURE_ERASED_TOPIC = get_topic(SubjectProfile.CaptureErased)
SUBJECT_ERASED_TOPIC = get_topic(SubjectProfile.SubjectErased)
DAMAGED_TOPIC = get_topic(SubjectProfile.DamagedEventQuarantined)
TOPICS = (
    QUARANTINED_TOPIC,
    RELEASED_TOPIC,
    CAPTURE_ERASED_TOPIC,
    SUBJECT_ERASED_TOPIC,
    DAMAGED_TOPIC,
)
#: Damaged events the pipeline sets aside in the whole log, at most. Storage damage is
#: rare and local (a flipped byte, a torn copy); many events failing authentication at
#: once is what a bug of ours (a changed associated-data format) or a key store that
#: is not this log's looks like, and quarantining them would hide it while the service
#: dropped every capture. Past this the pipeline stops at the next damaged event, as it
#: did before quarantine (fail closed), and the operator decides.
MAX_DAMAGED_EVENTS = 16
#: The stage and error class a damaged event's quarantine is listed with.
DAMAGED_STAGE = "damaged"
DAMAGED_ERROR = "DamagedEventError"
#: Notifications read per page when the index catches up with the log.
PAGE = 500


@dataclass(frozen=True)
class Failure:
    """Why a capture's extraction gave up: the stage (``extract``: the extractor raised;
    ``apply``: the update engine refused its proposals), the error's class, the attempts."""

    stage: str
    error: str
    attempts: int


@dataclass(frozen=True)
class Quarantined:
    """A capture an extraction batch has just set aside (committed with the batch)."""

    stream_id: UUID
    capture_id: str
    failure: Failure


@dataclass(frozen=True)
class QuarantinedCapture:
    """A capture in quarantine, as operators see it: ids, stage, error class, when."""

    capture_id: str
    #: The subject's audit pseudonym (never its reference).
    subject: str
    stage: str
    error: str
    attempts: int
    quarantined_at: datetime
    notification_id: int
    stream_id: UUID


@dataclass(frozen=True)
class RetryOutcome:
    """What a retry did: ``released`` (extracted now), ``still-failing`` (``error`` says
    with what; it stays quarantined) or ``not-quarantined`` (nothing to do)."""

    capture_id: str
    outcome: str
    error: str = ""


def _entry(
    tenant: str | None, subject_ref: str | None, capture_id: str, failure: Failure
) -> tuple[str, dict[str, object]]:
    """The ``capture.quarantined`` entry; ``tenant`` the subject's (None: the trail's own)."""
    return (
        "capture.quarantined",
        {
            "tenant": tenant,
            "subject_ref": subject_ref,
            "event_ids": [capture_id],
            "request_id": f"quarantine:{capture_id}",
            "outcome": failure.stage,
            "reason_code": failure.error,
            "counts": {"attempts": failure.attempts},
        },
    )


class QuarantineIndex:
    """The quarantined captures of the log, folded incrementally from the log's events."""

    def __init__(self, app: EventStore, ledger_state: Callable[[], LedgerState | None]) -> None:
        self._app = app
        self._ledger_state = ledger_state
        self._lock = threading.Lock()
        self._position = 0
        self._held: dict[str, tuple[UUID, Any, int]] = {}
        #: Damaged events set aside (their notification id -> (stream, verdict, the
        #: verdict's notification id)), while their subject is not erased.
        self._damaged: dict[int, tuple[UUID, Any, int]] = {}
        #: Every notification ever set aside as damaged, erased or not: what a projection
        #: (live or rebuilding) may pass over without projecting it.
        self._set_aside: set[int] = set()

    def _catch_up(self) -> None:
        # The head first: every notification up to it has committed (writers of the log
        # never interleave their ids), so once read up to it, the next call starts there
        # even when none of them was a quarantine event (else each call scanned the log).
        head = self._app.max_notification_id()
        if head <= self._position:
            return
        while page := self._app.notifications_after(self._position, PAGE, topics=TOPICS):
            for notification in page:
                if notification.id > head:
                    break
                self._fold(notification)
                self._position = notification.id
            if len(page) < PAGE or page[-1].id > head:
                break
        self._position = max(self._position, head)

    def _fold(self, notification: Any) -> None:
        try:
            event = self._app.decode(notification)
        except DamagedEventError:
            if notification.topic != DAMAGED_TOPIC:
                raise
            # A verdict that is not authentic (forged by a writer of the event store,
            # moved or damaged) names nothing to pass over: not honoured. The pipeline
            # meets the row itself and sets it aside with a verdict of its own (bug FN).
            return
        if isinstance(event, SubjectProfile.CaptureQuarantined):
            held = (event.originator_id, event, int(notification.id))
            self._held[event.capture_id] = held  # type: ignore[attr-defined]
        elif isinstance(event, SubjectProfile.CaptureReleased | SubjectProfile.CaptureErased):
            self._held.pop(event.capture_id, None)  # type: ignore[attr-defined]
        elif isinstance(event, SubjectProfile.DamagedEventQuarantined):
            nid = int(event.notification_id)
            self._damaged[nid] = (event.originator_id, event, int(notification.id))
            self._set_aside.add(nid)
        elif isinstance(event, SubjectProfile.SubjectErased):
            stream = event.originator_id
            for capture_id in [c for c, (s, _, _) in self._held.items() if s == stream]:
                del self._held[capture_id]
            for nid in [n for n, (s, _, _) in self._damaged.items() if s == stream]:
                del self._damaged[nid]
        # Shredded (ContentShredded): its capture or subject was erased; the tombstone
        # that follows in the log (or the ledger, until it is there) leaves it out.

    def held(self) -> list[tuple[UUID, Any, int]]:
        """(stream, CaptureQuarantined event, notification id) of every capture held now."""
        return self._both()[0]

    def _both(self) -> tuple[list[tuple[UUID, Any, int]], list[tuple[UUID, Any, int]]]:
        """Captures held, and damaged events set aside, after one catch-up with the log;
        what the erasure ledger names left out."""
        with self._lock:
            self._catch_up()
            held = list(self._held.values())
            damaged = list(self._damaged.values())
        state = self._ledger_state()
        if state is None:
            return held, damaged
        return [
            (stream, event, nid)
            for stream, event, nid in held
            if str(stream) not in state.streams
            and event.capture_id not in state.captures.get(str(stream), frozenset())
        ], [d for d in damaged if str(d[0]) not in state.streams]

    def damaged(self) -> list[tuple[UUID, Any, int]]:
        """(stream, DamagedEventQuarantined event, its notification id) of every damaged
        event set aside now (a subject erased, or named by the erasure ledger, is not)."""
        return self._both()[1]

    def set_aside_among(self, notification_ids: Sequence[int]) -> set[int]:
        """Those of these notifications the log holds a damaged-event verdict for (erased
        since or not): a projection passes over them. One head read when nothing is new."""
        with self._lock:
            self._catch_up()
            return self._set_aside.intersection(notification_ids)

    def damaged_count(self) -> int:
        """Damaged events ever set aside in this log (what ``MAX_DAMAGED_EVENTS`` bounds)."""
        with self._lock:
            self._catch_up()
            return len(self._set_aside)

    def count(self) -> int:
        held, damaged = self._both()
        return len(held) + len(damaged)


class DamagedEvents:
    """Set aside a damaged event the projections meet without a verdict.

    The extraction batch sets aside the captures it finds damaged, with its position
    (``uprof.services.extraction``). An event damaged after it was extracted and
    projected, or of another kind (an extracted item, a consent), is met first by a
    projection, a rebuild above all, which must not stop there for every subject of the
    partition (bug DC) nor pass over it unrecorded. The verdict cannot commit with the
    views' position (another store), so it commits first, on its own: a
    ``DamagedEventQuarantined`` at the stream's next version, read after the head, the
    index asked after the head, so that two processes writing it at once conflict on
    that version and the loser finds the winner's verdict. A projection killed after the
    verdict and before its position moves passes over the event next time by the
    verdict. Bounded by ``MAX_DAMAGED_EVENTS`` with the extraction's verdicts.
    """

    def __init__(
        self,
        app: EventStore,
        index: QuarantineIndex,
        now: Callable[[], datetime],
        recorded: Callable[[Sequence[Quarantined]], None],
    ) -> None:
        self._app = app
        self._index = index
        self._now = now
        self._recorded = recorded

    def set_aside(self, notification: Any) -> Any:
        """None once a verdict sets ``notification`` aside (written now, or by another
        process); the event it reads as when it opens now (its subject erased meanwhile:
        shredded). Raises ``DamagedEventError`` past ``MAX_DAMAGED_EVENTS``."""
        return retry.SUBJECT_WRITE.call(lambda: self._set_aside(notification))

    def _set_aside(self, notification: Any) -> Any:
        nid, stream = int(notification.id), notification.originator_id
        head = self._app.stream_versions([stream]).get(stream)
        if nid in self._index.set_aside_among([nid]) or head is None:
            return None
        try:
            # After the head: an erasure names the subject in its ledger before it
            # appends its tombstone, so one since reads as shredded here.
            return self._app.decode(notification)
        except DamagedEventError:
            pass
        if self._index.damaged_count() + 1 > MAX_DAMAGED_EVENTS:
            _log.error(
                "a stored event fails authentication and %d are set aside already: "
                "stopping (decision 0124-damaged-events-quarantined)",
                MAX_DAMAGED_EVENTS,
            )
            raise DamagedEventError(
                f"more than {MAX_DAMAGED_EVENTS} stored events fail authentication: "
                "the pipeline stops instead of setting them aside"
            )
        verdict = SubjectProfile.DamagedEventQuarantined(
            originator_id=stream,
            originator_version=head + 1,
            timestamp=SubjectProfile.DamagedEventQuarantined.create_timestamp(),
            notification_id=nid,
            damaged_version=int(notification.originator_version),
            quarantined_at=self._now(),
        )
        self._app.save_tracked([], None, events=[verdict])
        entry = damaged_entry_id(nid)
        self._recorded([Quarantined(stream, entry, Failure(DAMAGED_STAGE, DAMAGED_ERROR, 1))])
        return None


class QuarantineService:
    """Record, list and retry quarantined captures (the door authorizes the callers)."""

    def __init__(
        self,
        app: EventStore,
        audit: AuditTrail,
        index: QuarantineIndex,
        subjects_of: Callable[[Iterable[str]], dict[str, tuple[str, str]]],
        extract_again: Callable[[UUID, str], RetryOutcome],
        *,
        tenant_pseudonym_of: Callable[[str], str | None],
    ) -> None:
        """``subjects_of(streams)``: each live subject's (tenant, pseudonym) whatever its
        tenant, for the audit entry of a capture quarantined by the pipeline, which serves
        every tenant (the entry names the subject's tenant); ``tenant_pseudonym_of(stream)``:
        only when it is this deployment's tenant's, so operators list and retry their own
        tenant's captures."""
        self._app = app
        self._audit = audit
        self._index = index
        self._subjects_of = subjects_of
        self._tenant_pseudonym_of = tenant_pseudonym_of
        self._extract_again = extract_again

    def recorded(self, quarantined: Sequence[Quarantined]) -> None:
        """Audit and log captures a committed batch has just quarantined (once each)."""
        for q in quarantined:
            _log.warning(
                "capture %s quarantined: %s failed with %s after %d attempts",
                q.capture_id,
                q.failure.stage,
                q.failure.error,
                q.failure.attempts,
            )
        subjects = self._subjects_of(str(q.stream_id) for q in quarantined) if quarantined else {}
        entries = []
        for q in quarantined:
            # A subject erased since the save gets no entry: its tenant is no longer known
            # (the worker's would name another tenant's capture), and its erasure takes
            # the capture out of quarantine.
            if str(q.stream_id) not in subjects:
                continue
            tenant, pseudonym = subjects[str(q.stream_id)]
            entries.append(_entry(tenant, pseudonym, q.capture_id, q.failure))
        if entries:
            self._audit.record_many(entries, once_by=("request_id",))

    def _record_missing(self, rows: Sequence[QuarantinedCapture]) -> None:
        """Write the ``capture.quarantined`` entries the log lacks: a worker that died
        between its batch's commit and its append left the verdict without its entry.
        Written as the pipeline's (no principal), once however often this runs."""
        if not rows:
            return
        entries = [
            _entry(None, r.subject, r.capture_id, Failure(r.stage, r.error, r.attempts))
            for r in rows
        ]
        token = acting_principal.set(None)
        try:
            self._audit.record_many(entries, once_by=("request_id",))
        finally:
            acting_principal.reset(token)

    def captures(self) -> list[QuarantinedCapture]:
        """Every capture of this tenant held in quarantine, oldest first (a subject that
        is gone, or another tenant's, is left out)."""
        rows: list[QuarantinedCapture] = []
        held: list[tuple[UUID, Any, int]] = sorted(self.held_events(), key=lambda h: h[2])
        for stream, event, nid in held:
            pseudonym = self._tenant_pseudonym_of(str(stream))
            if pseudonym is None:
                continue
            rows.append(
                QuarantinedCapture(
                    capture_id=event.capture_id,
                    subject=pseudonym,
                    stage=event.stage,
                    error=event.error,
                    attempts=event.attempts,
                    quarantined_at=event.quarantined_at,
                    notification_id=nid,
                    stream_id=stream,
                )
            )
        for stream, event, _ in self._index.damaged():
            pseudonym = self._tenant_pseudonym_of(str(stream))
            if pseudonym is None:
                continue
            nid = int(event.notification_id)
            # Listed by its own log position: its capture id is inside the ciphertext.
            rows.append(
                QuarantinedCapture(
                    capture_id=damaged_entry_id(nid),
                    subject=pseudonym,
                    stage=DAMAGED_STAGE,
                    error=DAMAGED_ERROR,
                    attempts=1,
                    quarantined_at=event.quarantined_at,
                    notification_id=nid,
                    stream_id=stream,
                )
            )
        rows.sort(key=lambda r: r.notification_id)
        self._record_missing(rows)
        return rows

    def held_events(self) -> list[tuple[UUID, Any, int]]:
        return self._index.held()

    def count(self) -> int:
        """Captures held in quarantine in the whole log (every tenant: the pipeline
        serves them all; readiness and metrics are the deployment's)."""
        return self._index.count()

    def retry(self, capture_ids: Iterable[str] | None) -> list[RetryOutcome]:
        """Extract the named quarantined captures again (all of them with None)."""
        held = {q.capture_id: q for q in self.captures()}
        wanted = list(held) if capture_ids is None else list(dict.fromkeys(capture_ids))
        outcomes: list[RetryOutcome] = []
        for capture_id in wanted:
            q = held.get(capture_id)
            if q is None:
                outcomes.append(RetryOutcome(capture_id, "not-quarantined"))
                continue
            try:
                outcome = (
                    self._retry_damaged(q)
                    if q.stage == DAMAGED_STAGE
                    else self._extract_again(q.stream_id, capture_id)
                )
            except BaseException as refused:
                # Each release is its own write: a refusal here (the key revoked while
                # this capture was extracted, an outage) leaves the earlier ones released
                # and audited. Its answer says which (bug WL): ``retried_before``.
                if outcomes:
                    setattr(refused, _RETRIED_BEFORE, list(outcomes))
                raise
            if outcome.outcome != "not-quarantined":
                self._audit.record(
                    "capture.released" if outcome.outcome == "released" else "capture.retried",
                    subject_ref=q.subject or None,
                    event_ids=[capture_id],
                    outcome=outcome.outcome,
                    reason_code=outcome.error or None,
                )
            outcomes.append(outcome)
        return outcomes

    def _retry_damaged(self, q: QuarantinedCapture) -> RetryOutcome:
        """A damaged event is not extracted again in place: ``still-failing`` while it
        does not open, ``not-retryable`` once it does (a row repaired by hand). Its
        capture row was passed over by the projections at its position, so extracting it
        now would serve results the views and a rebuild place differently; the repair
        that brings it back is a restore of the stores from before the damage (its log
        holds no verdict and its positions are before the event, so the pipeline
        extracts it as any other), or the subject's erasure (decision
        0124-damaged-events-quarantined)."""
        notification = next(iter(self._app.notifications_after(q.notification_id - 1, 1)), None)
        if notification is None or int(notification.id) != q.notification_id:
            return RetryOutcome(q.capture_id, "not-quarantined")
        try:
            self._app.decode(notification)
        except DamagedEventError:
            return RetryOutcome(q.capture_id, "still-failing", DAMAGED_ERROR)
        return RetryOutcome(q.capture_id, "not-retryable")


#: The attribute a refusal raised partway through ``QuarantineService.retry`` carries.
_RETRIED_BEFORE = "uprof_retried_before"


def retried_before(error: BaseException) -> list[RetryOutcome]:
    """The outcomes of the captures a retry had retried (released ones audited
    ``capture.released``) before ``error`` stopped it, in order; [] if none."""
    return list(getattr(error, _RETRIED_BEFORE, ()))


def damaged_entry_id(notification_id: int) -> str:
    """The id a damaged event's quarantine is listed and retried by: its log position."""
    return f"event:{notification_id}"
