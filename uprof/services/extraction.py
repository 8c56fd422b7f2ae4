"""Extraction: captured interactions become attribute, memory and intent events.

The worker follows the profiles log for ``InteractionCaptured`` events, asks the
extractor for proposals, runs them through the update engine of each subject's
aggregate and saves the results *with* its tracking position in one transaction,
so each capture is extracted exactly once, even across crashes; the save commits only
from the position the batch started at, so also across worker processes.

Evidence binding is the kernel's job, not the extractor's: ``EvidenceChecker``
refuses any proposal citing an event that does not exist or belongs to another
subject, whoever proposed it (I1).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any
from uuid import UUID

from domain.errors import (
    ConcurrencyConflictError,
    EvidenceError,
    SubjectErasedError,
    SubjectNotFoundError,
    UprofError,
    VersionConflictError,
)
from domain.principal import acting_credential, qualified_agent
from domain.profile import ErasedItems, SubjectProfile
from domain.values import (
    AttributeProposal,
    CapturedInteraction,
    ExperienceProposal,
    IntentProposal,
    Interaction,
    MemoryProposal,
    ProposalBatch,
    SharingPolicy,
    attribute_spec,
)
from uprof import retry, telemetry
from uprof.crypto.mapper import DamagedEventError
from uprof.eventstore import CAPTURED_TOPIC
from uprof.partitions import Partitioning, owned_or_all
from uprof.ports import Clock, EventStore, Extractor, ViewStore
from uprof.recorders import GuardedTracking, PositionMovedError
from uprof.services.erased_items import ErasedItemGuard, Refused
from uprof.services.late_captures import LateCaptures
from uprof.services.quarantine import (
    DAMAGED_ERROR,
    DAMAGED_STAGE,
    MAX_DAMAGED_EVENTS,
    Failure,
    Quarantined,
    RetryOutcome,
    damaged_entry_id,
)

_log = logging.getLogger(__name__)


def category_of(proposal: Any) -> str | None:
    """The category a proposal writes to; None when only the aggregate knows it."""
    if isinstance(proposal, AttributeProposal):
        return attribute_spec(proposal.key).category
    if isinstance(proposal, MemoryProposal | IntentProposal):
        return str(proposal.category)
    if isinstance(proposal, ExperienceProposal):
        return "experience"
    return None


def evidence_ids(batch: ProposalBatch) -> set[str]:
    return {e for p in batch.proposals for e in p.evidence}


_OPENS_AGAIN = "a damaged event opened again while its batch ran: the batch is read again"


class _OpensAgain(VersionConflictError):
    """A damaged event opened between two reads of one batch (a row repaired by hand):
    the batch is read again (``retry.EXTRACTION_BATCH``), nothing of it saved."""


class _Redo(Exception):
    """A capture's proposals failed to apply: apply the subject's others again, afresh."""


def _starved(error: BaseException) -> ConcurrencyConflictError:
    return ConcurrencyConflictError("extraction kept losing the race to concurrent captures")


class EvidenceChecker:
    """Check that every cited event exists, belongs to the same subject, and may be seen
    by the batch's agent (I4).

    Without the last check an agent could cite another agent's private capture (its id
    shows in provenance labels): its own items then counted among what that capture
    reveals, adding their categories to the capture's memories, so that the owner's own
    memories were withheld from its slices. A capture the agent may not see is answered
    as one that does not exist.
    """

    def __init__(self, queries: ViewStore) -> None:
        self._queries = queries

    def check(self, stream_id: UUID, batch: ProposalBatch, known: dict[str, UUID]) -> None:
        cited = evidence_ids(batch)
        unknown = cited - known.keys()
        rows = self._queries.captures(unknown)
        unseen = {
            capture_id
            for capture_id, row in rows.items()
            if not SharingPolicy.parse(row.sharing).allows(
                owner_agent=qualified_agent(row.app_id, row.agent_id),
                reader_agent=batch.owner_agent,
                reader_agent_type="",
            )
        }
        missing = (unknown - rows.keys()) | unseen
        foreign = {
            e for e in cited - missing if str(known.get(e) or rows[e].stream_id) != str(stream_id)
        }
        if missing or foreign:
            # One answer for both: "belongs to another subject" told an app holding a
            # stray capture id that the id is a real capture, and whose it is not.
            refused = min(missing | foreign)
            at = next(i for i, p in enumerate(batch.proposals) if refused in p.evidence)
            raise EvidenceError(
                f"evidence {refused!r} does not name a captured event of this subject "
                "that this agent may see",
                field=f"proposals.{at}.evidence",
            )


def interaction_of(event: Any) -> Interaction:
    """Rebuild the Interaction value from its captured event."""
    return Interaction(
        app_id=event.app_id,
        agent_id=event.agent_id,
        agent_type=event.agent_type,
        occurred_at=event.occurred_at,
        user_input=event.user_input,
        agent_response=event.agent_response,
        session_id=event.session_id,
        actor=event.actor,
        source_ref=event.source_ref,
        purpose=event.purpose,
        sharing=event.sharing,
        context=tuple(sorted(event.context.items())),
    )


class ExtractionWorker:
    """Follow the log and extract each capture exactly once, in any number of processes.

    Each batch is saved with a guarded tracking position (``uprof.recorders``): it
    commits only if the partition's position is still the one the batch started
    from, so two workers that read the same captures never both record results.
    With ``partitioning`` of M, this worker runs the ``partitions`` it is given (all
    by default) and answers positions for every partition.
    """

    def __init__(
        self,
        app: EventStore,
        extractor: Extractor,
        evidence: EvidenceChecker,
        clock: Clock,
        batch_size: int = 256,
        may_capture: Callable[[str, str, str], frozenset[str]] | None = None,
        *,
        partitioning: Partitioning | None = None,
        partitions: Sequence[int] | None = None,
        erased_items: ErasedItemGuard | None = None,
        late_captures: LateCaptures | None = None,
        tenant: str = "default",
        tenants_of: Callable[[Iterable[str]], dict[str, tuple[str, str]]] | None = None,
    ) -> None:
        self._app = app
        #: The check that each extracted request is on the audit log (decision
        #: 0101-capture-accepted-reconciled): told of each committed batch's captures.
        self._late = late_captures
        #: The erasure ledger's check: no proposal records again an item an erasure took.
        self._erased_items = erased_items
        self._extractor = extractor
        self._evidence = evidence
        self._clock = clock
        self._batch_size = batch_size
        #: (tenant, app, purpose) -> categories that app's captures may yield under that
        #: tenant's policy; None: all.
        self._may_capture = may_capture
        #: This deployment's tenant, and the subjects' own (stream id -> (tenant,
        #: pseudonym), ``KeyStore.subjects_of_streams``): a worker extracts every tenant's
        #: captures, each decided by its subject's tenant's policy.
        self._tenant = tenant
        self._tenants_of = tenants_of
        self._partitioning = partitioning or Partitioning()
        self._owned = owned_or_all(self._partitioning, partitions)
        if late_captures is not None:
            for k in self._owned:
                late_captures.follow(self.tracking_name(k), self._partition_test(k))
        #: Batches that lost the race to another worker (re-read and redone).
        self.moved_conflicts = 0
        #: Told of the captures a committed batch quarantined (audit and log: the
        #: composition root sets it to ``QuarantineService.recorded``).
        self.on_quarantined: Callable[[Sequence[Quarantined]], None] = lambda _q: None
        #: How many damaged events the log sets aside (the composition root sets it to
        #: ``QuarantineIndex.damaged_count``): bounds them by ``MAX_DAMAGED_EVENTS``.
        self.damaged_count: Callable[[], int] = lambda: 0
        #: Which of these notifications the log already sets aside as damaged (the
        #: projections may have met them first: ``QuarantineIndex.set_aside_among``).
        self.already_set_aside: Callable[[Sequence[int]], set[int]] = lambda _ids: set()
        #: Captures of the batch in hand whose extraction gave up: a batch redone after a
        #: lost race does not ask the extractor again (cleared when the partition's run ends).
        self._failures: dict[str, Failure] = {}

    def _partition_test(self, k: int) -> Callable[[Any], bool]:
        return lambda stream_id: self._partitioning.of(stream_id) == k

    @property
    def partitions(self) -> tuple[int, ...]:
        return self._owned

    @property
    def late_captures(self) -> LateCaptures | None:
        """The late ``capture.accepted`` check (its counts are metrics), if any."""
        return self._late

    def tracking_name(self, k: int) -> str:
        return self._partitioning.name(self._app.name, k)

    def tracking_name_for(self, stream_id: UUID) -> str:
        """The position that covers this subject's captures."""
        return self.tracking_name(self._partitioning.of(stream_id))

    def partition_position(self, k: int) -> int:
        return self._app.tracking_position(self.tracking_name(k))

    @property
    def position(self) -> int:
        """The lowest position of every partition: all captures up to it are extracted."""
        return min(self.partition_position(k) for k in self._partitioning.all)

    def lag(self) -> int:
        """Captures not yet extracted (in every partition, up to 10,000)."""
        return sum(pending for _, pending in self.pending_by_partition())

    def pending_by_partition(self) -> tuple[tuple[int, int], ...]:
        """Every partition's (owned or not) position and captures not yet extracted (up
        to 10,000), in partition order."""
        found = []
        for k in self._partitioning.all:
            position = self.partition_position(k)
            after = self._app.notifications_after(position, 10_000, topics=(CAPTURED_TOPIC,))
            pending = sum(1 for n in after if self._partitioning.of(n.originator_id) == k)
            found.append((position, pending))
        return tuple(found)

    def run_once(self) -> int:
        """Extract one batch per owned partition; returns how many notifications it consumed.

        A batch that another worker saved first (``PositionMovedError``) is dropped and
        re-read at once. Raises ConcurrencyConflictError when captures kept winning the
        race for the batch's subjects; the batch is then retried by the next run.
        """
        consumed = sum(self._run_partition(k) for k in self._owned)
        if self._late is not None:
            self._late.check_due()  # batches extracted earlier, now old enough
        return consumed

    def _run_partition(self, k: int) -> int:
        # Another worker committed this range (position), or a capture saved first to one
        # of the batch's subjects (version): nothing of ours was written; re-read, redo.
        try:
            return retry.EXTRACTION_BATCH.call(
                lambda: self._run_batch(k), before_retry=self._count_lost_race, give_up=_starved
            )
        finally:
            self._failures.clear()

    def _count_lost_race(self, error: BaseException) -> None:
        if isinstance(error, PositionMovedError):
            self.moved_conflicts += 1

    def run_until_idle(self) -> int:
        total = 0
        while consumed := self.run_once():
            total += consumed
        return total

    def run_until(self, target: int) -> int:
        """Extract the owned partitions until each has passed ``target`` (or has nothing
        left to read); what is captured meanwhile is left to the workers, so this ends
        under any capture load (``run_until_idle`` ends only when captures stop)."""
        total = 0
        while any(self.partition_position(k) < target for k in self._owned):
            consumed = self.run_once()
            if not consumed:
                break
            total += consumed
        if self._late is not None:
            # What earlier runs extracted and is old enough now, even when nothing was
            # left to extract (``run_once`` checks too): with no server (a CLI-only
            # deployment) this is the only check there is (review of 0112).
            self._late.check_due()
        return total

    def _run_batch(self, k: int) -> int:
        start = self.partition_position(k)
        notifications = self._app.notifications_after(
            start, self._batch_size, topics=(CAPTURED_TOPIC,)
        )
        if not notifications:
            return 0
        if self._late is not None:
            # What this batch commits is to be checked, even by another process.
            self._late.begin(self.tracking_name(k), start)
        with telemetry.span(
            "uprof.extraction.batch", partition=k, notifications=len(notifications)
        ) as traced:
            return self._extract_batch(k, start, notifications, traced)

    def _extract_batch(
        self, k: int, start: int, notifications: Sequence[Any], traced: telemetry.SpanLike
    ) -> int:
        mine = [n for n in notifications if self._partitioning.of(n.originator_id) == k]
        # The extractor (a model, perhaps a remote one) runs first, outside any turn: it
        # needs the captured event only, not the subject's state.
        by_stream: dict[UUID, list[tuple[Any, ProposalBatch | Failure]]] = defaultdict(list)
        captured: list[tuple[Any, Any]] = []
        damaged: list[Any] = []  # notifications whose stored event does not open
        with telemetry.span("uprof.extraction.extract", captures=len(mine)) as extracting:
            readable = []
            for notification in mine:
                try:
                    event = self._app.decode(notification)
                except DamagedEventError:
                    # Storage damage only (the mapper's verdict: the key is there and
                    # genuine, the stored bytes fail authentication). A missing or
                    # wrong key, a key store error or a bug decoding an authenticated
                    # plaintext is another error and stops the batch, as before.
                    damaged.append(notification)
                    continue
                captured.append((notification, event))
                if not isinstance(event, SubjectProfile.ContentShredded):
                    readable.append(event)
            if damaged:
                known = self.already_set_aside([int(n.id) for n in damaged])
                self._refuse_past_damage_limit(len(damaged) - len(known))
            tenants = self._tenants({e.originator_id for e in readable})
            for event in readable:
                tenant = tenants.get(event.originator_id, self._tenant)
                by_stream[event.originator_id].append((event, self._proposals_for(event, tenant)))
            proposals = sum(
                len(b.proposals)
                for e in by_stream.values()
                for _, b in e
                if isinstance(b, ProposalBatch)
            )
            extracting.set(proposals=proposals)
        traced.set(captures=len(mine), subjects=len(by_stream), proposals=proposals)
        now = self._clock.now()
        # Then load, apply and save while this process's writers of those subjects wait
        # their turn, so a capture arriving meanwhile cannot make the batch lose the race.
        # The position moves over the whole batch, other partitions' captures included.
        tracking = GuardedTracking(self.tracking_name(k), notifications[-1].id, expected=start)
        # Loading a subject (snapshot plus tail, decrypted) is the slow part: done before
        # the turns, and only brought up to date under them, so the capture writer, which
        # waits for these turns, waits for the apply and the save only (decision 0017).
        loaded = {}
        # Subjects whose stream holds a damaged event cannot be loaded: their captures in
        # this batch are set aside with the damaged ones (by stream, in log order).
        unreadable: dict[UUID, list[Any]] = defaultdict(list)
        for notification in damaged:
            unreadable[notification.originator_id].append(notification)
        for stream_id in by_stream:
            if stream_id in unreadable:
                continue
            try:
                loaded[stream_id] = self._app.load(stream_id)
            except (SubjectErasedError, SubjectNotFoundError):
                continue
            except DamagedEventError:
                unreadable[stream_id] = []
        quarantined: list[Quarantined] = []
        refused: list[Refused] = []
        with self._app.writer_turns([*by_stream, *unreadable]):
            verdicts = self._set_aside(unreadable, by_stream, now, quarantined)
            profiles = []
            for stream_id, extracted in by_stream.items():
                if stream_id not in loaded:
                    continue
                try:
                    profile = self._app.catch_up(loaded[stream_id])
                    profile = self._apply(profile, extracted, now, quarantined, refused)
                except SubjectErasedError:  # erased since it was loaded
                    continue
                profiles.append(profile)
            with telemetry.span("uprof.extraction.save", subjects=len(profiles)):
                self._app.save_tracked(profiles, tracking, events=verdicts)
        if self._late is not None:
            self._late.extracted(
                captured, notifications[-1].id, extraction=self.tracking_name(k), start=start
            )
        if quarantined:
            self.on_quarantined(quarantined)
        if refused and self._erased_items is not None:
            self._erased_items.recorded(refused)
        return len(notifications)

    def _apply(
        self,
        profile: SubjectProfile,
        extracted: Sequence[tuple[Any, ProposalBatch | Failure]],
        now: Any,
        quarantined: list[Quarantined],
        refused: list[Refused],
    ) -> SubjectProfile:
        """Apply one subject's extracted captures in order; quarantine those that failed.

        The update engine is domain code over the loaded state, so an error there is
        the same at every attempt: the capture is quarantined at once (stage ``apply``)
        and the subject's other captures are applied again to a freshly loaded profile
        (the failed apply may have left events pending on this one)."""
        failed = {e.capture_id: b for e, b in extracted if isinstance(b, Failure)}
        while True:
            dropped: list[Refused] = []  # of this attempt: a redo starts afresh
            erased = self._erased_check(profile.id, dropped)
            try:
                for event, batch in extracted:
                    if event.capture_id in failed or not isinstance(batch, ProposalBatch):
                        continue
                    self._evidence.check(profile.id, batch, known={event.capture_id: profile.id})
                    try:
                        profile.apply_proposals(
                            batch, observed_at=event.occurred_at, now=now, erased=erased
                        )
                    except (ConcurrencyConflictError, SubjectErasedError):
                        raise
                    except Exception as error:
                        failed[event.capture_id] = Failure("apply", type(error).__name__, 1)
                        raise _Redo from error
            except _Redo:
                profile = self._app.load(profile.id)
                continue
            break
        refused.extend(dropped)
        for event, _ in extracted:
            failure = failed.get(event.capture_id)
            if failure is None:
                continue
            if profile.quarantine_capture(
                event.capture_id,
                stage=failure.stage,
                error=failure.error,
                attempts=failure.attempts,
                now=now,
            ):
                quarantined.append(Quarantined(profile.id, event.capture_id, failure))
        return profile

    def _refuse_past_damage_limit(self, new: int) -> None:
        """Fail closed when setting these aside would pass ``MAX_DAMAGED_EVENTS``: many
        events failing authentication is a bug of ours or the wrong key store far more
        often than storage damage, and the pipeline then stops as it did before."""
        if self.damaged_count() + new > MAX_DAMAGED_EVENTS:
            _log.error(
                "%d stored events fail authentication and %d are set aside already: "
                "stopping instead of setting aside more than %d (a wrong key store or a "
                "bug looks like this; decision 0124-damaged-events-quarantined)",
                new,
                self.damaged_count(),
                MAX_DAMAGED_EVENTS,
            )
            raise DamagedEventError(
                f"more than {MAX_DAMAGED_EVENTS} stored events fail authentication: "
                "the pipeline stops instead of setting them aside"
            )

    def _set_aside(
        self,
        unreadable: dict[UUID, list[Any]],
        by_stream: dict[UUID, list[tuple[Any, ProposalBatch | Failure]]],
        now: Any,
        quarantined: list[Quarantined],
    ) -> list[Any]:
        """The verdicts that set aside, in the batch's save, the damaged events and the
        captures of subjects whose stream holds one (they cannot be applied: the subject
        does not load). Built from the stored rows' metadata at each stream's head, so
        the insert's version check orders them against other writers; the guarded
        position makes them one verdict across processes (decision 0087). A subject
        erased since its event failed reads as shredded now (its ledger entry comes
        before its tombstone): nothing is appended after a tombstone."""
        heads = self._app.stream_versions(list(unreadable))
        verdicts: list[Any] = []
        for stream_id, notifications in unreadable.items():
            if stream_id not in heads:
                continue
            # Asked after the head was read: a verdict committed since (the projections
            # set these aside too) conflicts with ours on the stream's next version.
            known = self.already_set_aside([int(n.id) for n in notifications])
            still, shredded = [], False
            for notification in notifications:
                if int(notification.id) in known:
                    continue
                try:
                    event = self._app.decode(notification)
                except DamagedEventError:
                    still.append(notification)
                    continue
                if not isinstance(event, SubjectProfile.ContentShredded):
                    raise _OpensAgain(_OPENS_AGAIN)
                shredded = True
            if shredded:
                continue  # erased meanwhile: its keys are gone, so is the damage
            if not notifications and not self._still_unreadable(stream_id):
                continue  # erased (or repaired) meanwhile: nothing to set aside
            version = heads[stream_id]
            for notification in still:
                version += 1
                verdicts.append(
                    SubjectProfile.DamagedEventQuarantined(
                        originator_id=stream_id,
                        originator_version=version,
                        timestamp=SubjectProfile.DamagedEventQuarantined.create_timestamp(),
                        notification_id=int(notification.id),
                        damaged_version=int(notification.originator_version),
                        quarantined_at=now,
                    )
                )
                failure = Failure(DAMAGED_STAGE, DAMAGED_ERROR, 1)
                entry = damaged_entry_id(int(notification.id))
                quarantined.append(Quarantined(stream_id, entry, failure))
            for event, _ in by_stream.pop(stream_id, []):
                version += 1
                verdicts.append(
                    SubjectProfile.CaptureQuarantined(  # type: ignore[call-arg]  # made by @event
                        originator_id=stream_id,
                        originator_version=version,
                        timestamp=SubjectProfile.CaptureQuarantined.create_timestamp(),
                        capture_id=event.capture_id,
                        stage="load",
                        error=DAMAGED_ERROR,
                        attempts=1,
                        quarantined_at=now,
                        evidence=[event.capture_id],
                    )
                )
                failure = Failure("load", DAMAGED_ERROR, 1)
                quarantined.append(Quarantined(stream_id, event.capture_id, failure))
        return verdicts

    def _still_unreadable(self, stream_id: UUID) -> bool:
        """Whether the subject still fails to load on a damaged event, asked after its
        head was read: an erasure since names it in the ledger first, and then every
        event of it reads as shredded (nothing is appended after its tombstone)."""
        try:
            profile = self._app.load(stream_id)
        except DamagedEventError:
            return True
        except (SubjectErasedError, SubjectNotFoundError):
            return False
        if profile.erased:
            return False
        raise _OpensAgain(_OPENS_AGAIN)

    def _erased_check(self, stream_id: UUID, refused: list[Refused]) -> ErasedItems | None:
        if self._erased_items is None:
            return None
        return self._erased_items.check(stream_id, refused)

    def _extract(self, event: Any) -> ProposalBatch | Failure:
        """The extractor's proposals for a capture, with ``retry.EXTRACTOR_CALL``'s
        attempts; a ``Failure`` when every attempt raised (the capture is then
        quarantined). Only the extractor's call is retried and judged here: an error of
        the stores or the policy is the pipeline's, not the capture's, and so is an
        extractor's declared failure (``UprofError``), raised at once."""
        known = self._failures.get(event.capture_id)
        if known is not None:
            return known
        capture = CapturedInteraction(event.capture_id, interaction_of(event))
        attempts = 0

        def attempt() -> ProposalBatch:
            nonlocal attempts
            attempts += 1
            return self._extractor.extract(capture)

        try:
            return retry.EXTRACTOR_CALL.call(attempt)
        except UprofError:
            # The extractor's declared failure (the model server failed): the capture
            # waits in the log and the batch fails, as UPROF_LLM_FALLBACK=wait promises.
            raise
        except Exception as error:
            failure = Failure("extract", type(error).__name__, attempts)
            self._failures[event.capture_id] = failure
            return failure

    def extract_again(self, stream_id: UUID, capture_id: str) -> RetryOutcome:
        """An operator's retry of a quarantined capture: extract it (bounded attempts,
        outside the subject's writer turn: a model may be slow), then, in one
        load-decide-save of the subject's stream, apply its proposals and save them with
        ``CaptureReleased``. A retry that lost to another (any process) reloads and finds
        it released; a capture still failing saves nothing."""
        try:
            profile = self._app.load(stream_id)
        except DamagedEventError:  # its stream still holds a damaged event
            return RetryOutcome(capture_id, "still-failing", DAMAGED_ERROR)
        if capture_id not in profile.quarantined:
            return RetryOutcome(capture_id, "not-quarantined")
        event = next(
            (
                e
                for e in self._app.stream_events(stream_id)
                if isinstance(e, SubjectProfile.InteractionCaptured) and e.capture_id == capture_id
            ),
            None,
        )
        if event is None:  # shredded meanwhile: an erasure takes it out of quarantine
            return RetryOutcome(capture_id, "not-quarantined")
        self._failures.pop(capture_id, None)
        batch = self._proposals_for(event, self._tenants({stream_id}).get(stream_id, self._tenant))
        self._failures.pop(capture_id, None)
        if isinstance(batch, Failure):
            return RetryOutcome(capture_id, "still-failing", batch.error)

        refused: list[Refused] = []

        def apply_and_release() -> RetryOutcome:
            profile = self._app.load(stream_id)
            if capture_id not in profile.quarantined:
                return RetryOutcome(capture_id, "not-quarantined")
            self._evidence.check(profile.id, batch, known={capture_id: profile.id})
            now = self._clock.now()
            refused.clear()  # of this attempt only
            erased = self._erased_check(stream_id, refused)
            try:
                profile.apply_proposals(
                    batch, observed_at=event.occurred_at, now=now, erased=erased
                )
            except (ConcurrencyConflictError, SubjectErasedError):
                raise
            except Exception as error:  # nothing is saved: the profile is dropped
                return RetryOutcome(capture_id, "still-failing", type(error).__name__)
            profile.release_capture(capture_id, now=now)
            self._app.save(profile)
            return RetryOutcome(capture_id, "released")

        # The retry is an operator key's act: the key is asked in the subject's writer
        # turn, after the model ran, and under the store's lock; a key revoked meanwhile
        # releases nothing (bug UR; US).
        outcome = self._app.with_retry(
            apply_and_release, subject=stream_id, credential=acting_credential.get()
        )
        if outcome.outcome == "released" and refused and self._erased_items is not None:
            self._erased_items.recorded(refused)
        return outcome

    def _tenants(self, stream_ids: set[UUID]) -> dict[UUID, str]:
        """The tenant of each live subject among these streams (one read; {} when only
        this deployment's tenant is decided for, or for none)."""
        if self._tenants_of is None or self._may_capture is None or not stream_ids:
            return {}
        found = self._tenants_of(str(s) for s in stream_ids)
        return {s: found[str(s)][0] for s in stream_ids if str(s) in found}

    def _proposals_for(self, event: Any, tenant: str) -> ProposalBatch | Failure:
        """The extractor's proposals for a capture, bounded by what the capturing app may
        capture under ``tenant``'s policy (the subject's tenant)."""
        batch = self._extract(event)
        if isinstance(batch, Failure):
            return batch
        # An extractor may only cite the capture it was given; anything else is dropped
        # here rather than trusted (the model does not decide what counts as evidence).
        own = {event.capture_id}
        kept = tuple(p for p in batch.proposals if set(p.evidence) <= own)
        if self._may_capture is not None:
            # The capturing app's policy bounds what its captures may become.
            permitted = self._may_capture(tenant, event.app_id, event.purpose)
            kept = tuple(p for p in kept if category_of(p) in permitted | {None})
        return replace(
            batch,
            proposals=kept,
            app_id=event.app_id,
            purpose=event.purpose,
            # Agents belong to their app: the owner is the qualified agent (I4).
            owner_agent=qualified_agent(event.app_id, batch.owner_agent or event.agent_id),
        )
