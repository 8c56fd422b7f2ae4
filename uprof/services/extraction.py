"""Extraction: captured interactions become attribute, memory and intent events.

The worker follows the profiles log for ``InteractionCaptured`` events, asks the
extractor for proposals, runs them through the update engine of each subject's
aggregate and saves the results *with* its tracking position in one transaction,
so each capture is extracted exactly once, even across crashes.

Evidence binding is the kernel's job, not the extractor's: ``EvidenceChecker``
refuses any proposal citing an event that does not exist or belongs to another
subject, whoever proposed it (I1).
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from dataclasses import replace
from collections.abc import Callable
from typing import Any
from uuid import UUID

from eventsourcing.persistence import IntegrityError, RecordConflictError, Tracking

from domain.errors import (
    ConcurrencyConflictError,
    EvidenceError,
    SubjectErasedError,
    SubjectNotFoundError,
)
from domain.principal import qualified_agent
from domain.profile import SubjectProfile
from domain.values import (
    AttributeProposal,
    CapturedInteraction,
    ExperienceProposal,
    IntentProposal,
    Interaction,
    MemoryProposal,
    ProposalBatch,
    attribute_spec,
)
from projections.profile.queries import ProfileQueries
from uprof.eventstore import CAPTURED_TOPIC, CONFLICT_RETRIES, ProfilesApplication
from uprof.ports import Clock, Extractor


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


class EvidenceChecker:
    """Check that every cited event exists and belongs to the same subject."""

    def __init__(self, queries: ProfileQueries) -> None:
        self._queries = queries

    def check(self, stream_id: UUID, batch: ProposalBatch, known: dict[str, UUID]) -> None:
        cited = evidence_ids(batch)
        unknown = cited - known.keys()
        rows = self._queries.captures(unknown)
        missing = sorted(unknown - rows.keys())
        if missing:
            raise EvidenceError(f"evidence {missing[0]!r} does not name a captured event")
        foreign = sorted(
            e for e in cited if str(known.get(e) or rows[e].stream_id) != str(stream_id)
        )
        if foreign:
            raise EvidenceError(f"evidence {foreign[0]!r} belongs to another subject")


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
    """Follow the log and extract each capture exactly once."""

    def __init__(
        self,
        app: ProfilesApplication,
        extractor: Extractor,
        evidence: EvidenceChecker,
        clock: Clock,
        batch_size: int = 256,
        may_capture: Callable[[str, str], frozenset[str]] | None = None,
    ) -> None:
        self._app = app
        self._extractor = extractor
        self._evidence = evidence
        self._clock = clock
        self._batch_size = batch_size
        #: (app, purpose) -> categories that app's captures may yield; None: all.
        self._may_capture = may_capture

    @property
    def position(self) -> int:
        return self._app.tracking_position(self._app.name)

    def lag(self) -> int:
        """Captures not yet extracted."""
        pending = self._app.notifications_after(self.position, 10_000, topics=(CAPTURED_TOPIC,))
        return len(pending)

    def run_once(self) -> int:
        """Extract one batch of captures; returns how many notifications it consumed.

        Raises ConcurrencyConflictError when captures kept winning the race for the
        batch's subjects; the batch is then retried by the next run.
        """
        for attempt in range(CONFLICT_RETRIES):
            try:
                return self._run_batch()
            except (RecordConflictError, IntegrityError):
                # A capture or a concurrent worker saved first; back off, re-read, redo.
                time.sleep(random.uniform(0, min(0.2, 0.002 * (2**attempt))))
        raise ConcurrencyConflictError("extraction kept losing the race to concurrent captures")

    def run_until_idle(self) -> int:
        total = 0
        while consumed := self.run_once():
            total += consumed
        return total

    def _run_batch(self) -> int:
        start = self.position
        notifications = self._app.notifications_after(
            start, self._batch_size, topics=(CAPTURED_TOPIC,)
        )
        if not notifications:
            return 0
        # The extractor (a model, perhaps a remote one) runs first, outside any turn: it
        # needs the captured event only, not the subject's state.
        by_stream: dict[UUID, list[tuple[Any, ProposalBatch]]] = defaultdict(list)
        for notification in notifications:
            event = self._app.decode(notification)
            if isinstance(event, SubjectProfile.ContentShredded):
                continue
            by_stream[event.originator_id].append((event, self._proposals_for(event)))
        now = self._clock.now()
        # Then load, apply and save while this process's writers of those subjects wait
        # their turn, so a capture arriving meanwhile cannot make the batch lose the race.
        with self._app.writer_turns(by_stream):
            profiles = []
            for stream_id, extracted in by_stream.items():
                try:
                    profile = self._app.load(stream_id)
                except (SubjectErasedError, SubjectNotFoundError):
                    continue
                for event, batch in extracted:
                    self._evidence.check(profile.id, batch, known={event.capture_id: profile.id})
                    profile.apply_proposals(batch, observed_at=event.occurred_at, now=now)
                profiles.append(profile)
            self._app.save_tracked(profiles, Tracking(self._app.name, notifications[-1].id))
        return len(notifications)

    def _proposals_for(self, event: Any) -> ProposalBatch:
        capture = CapturedInteraction(event.capture_id, interaction_of(event))
        batch = self._extractor.extract(capture)
        # An extractor may only cite the capture it was given; anything else is dropped
        # here rather than trusted (the model does not decide what counts as evidence).
        own = {event.capture_id}
        kept = tuple(p for p in batch.proposals if set(p.evidence) <= own)
        if self._may_capture is not None:
            # The capturing app's policy bounds what its captures may become.
            permitted = self._may_capture(event.app_id, event.purpose)
            kept = tuple(p for p in kept if category_of(p) in permitted | {None})
        return replace(
            batch,
            proposals=kept,
            app_id=event.app_id,
            purpose=event.purpose,
            # Agents belong to their app: the owner is the qualified agent (I4).
            owner_agent=qualified_agent(event.app_id, batch.owner_agent or event.agent_id),
        )
