"""The SubjectProfile aggregate: one event stream per data subject.

Its state is deliberately small — consents, the current attribute set, active
intents and counters — so that loading it (snapshot plus a short tail) costs the
same whether the subject has a hundred events or a hundred thousand. Memories are
recorded as events but never held here; the read side keeps them. The one exception is
the ids of archived memories (``archived_memories``), so that archiving is decided once
per memory whichever process asks (docs/decisions, "The decay job archives each memory
once").

Commands decide (consent gate, evidence rule, merge/conflict/supersession,
intent lifecycle); the ``@event`` methods only apply what was decided, so replay
never re-decides.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from eventsourcing.domain import Aggregate, event
from eventsourcing.utils import get_topic

from domain.categories import memory_categories
from domain.errors import (
    ConsentRequiredError,
    IntentTransitionError,
    InvalidInputError,
    StoredDataDamagedError,
    SubjectErasedError,
)
from domain.normalise import clamp, combine, decayed, match_described, normalise_value
from domain.values import (
    ATTRIBUTE_KEYS,
    CATEGORIES,
    INFERRED_CONFIDENCE_CAP,
    MAX_EVIDENCE_IN_AGGREGATE,
    AttributeProposal,
    AttributeStatus,
    ConsentGrant,
    ExperienceProposal,
    IntentProposal,
    IntentStatus,
    IntentUpdateProposal,
    Interaction,
    MemoryProposal,
    ProposalBatch,
    Provenance,
    SharingPolicy,
    attribute_spec,
    check_category,
)

#: Confidence of an attribute halves after this many days without new evidence.
ATTRIBUTE_HALF_LIFE_DAYS = 180.0
#: Consent that capture itself needs: the raw interaction is "conversation" data.
CAPTURE_CATEGORY = "conversation"
#: The primary category of every experience memory.
EXPERIENCE_CATEGORY = "experience"


def capture_consent_refusal(interaction: Interaction) -> ConsentRequiredError:
    """Why a capture is refused at the consent gate: the same words whether the subject
    does not exist or the app holds no consent of it, so that no app can tell which."""
    return ConsentRequiredError(
        f"app {interaction.app_id!r} has no consent in force to capture "
        f"{CAPTURE_CATEGORY!r} data for purpose {interaction.purpose!r}"
    )


def _new_id() -> str:
    return uuid.uuid4().hex


#: Whether an erasure took what a proposal would record: called with the proposal's
#: (kind, identity, evidence) and True when an erased item of this subject had that
#: identity and cited one of those captures. The kernel builds it from the erasure
#: ledger (keyed hashes, decision 0097-erased-items-not-reborn); the aggregate only says
#: what a proposal's identity is, the same for the proposal and the event it records.
ErasedItems = Callable[[str, str, tuple[str, ...]], bool]


def _identity_parts(*texts: str) -> str:
    # Stripped first, as the update engine strips what it records.
    return "\x1f".join(normalise_value(t.strip()) for t in texts)


def proposal_identity(proposal: Any) -> tuple[str, str] | None:
    """(kind, identity) of the item a proposal would record or reinforce; None for one
    that records nothing (a retraction, an intent update).

    The identity is what the update engine matches items on: an attribute's key and
    normalised value, an intent's normalised description, a memory's normalised text,
    an experience's normalised fields. ``recorded_identity`` of the event the proposal
    records is the same pair."""
    if isinstance(proposal, AttributeProposal):
        if proposal.negated:
            return None
        return ("attribute", f"{proposal.key}\x1f{_identity_parts(proposal.value)}")
    if isinstance(proposal, IntentProposal):
        return ("intent", _identity_parts(proposal.description))
    if isinstance(proposal, MemoryProposal):
        return ("memory", _identity_parts(proposal.text))
    if isinstance(proposal, ExperienceProposal):
        fields = (proposal.situation, proposal.action, proposal.outcome, proposal.insight)
        return ("experience", _identity_parts(*fields))
    return None


def recorded_identity(event: Any) -> tuple[str, str] | None:
    """(kind, identity) of the item an event records (``proposal_identity``'s pair for
    the proposal it came from); None for any other event."""
    e: Any = event  # the @event classes declare no fields to the type checker
    if isinstance(event, SubjectProfile.AttributeRecorded | SubjectProfile.AttributeRestated):
        return ("attribute", f"{e.key}\x1f{_identity_parts(e.value)}")
    if isinstance(event, SubjectProfile.IntentRecorded):
        return ("intent", _identity_parts(e.description))
    if isinstance(event, SubjectProfile.MemoryRecorded):
        return ("memory", _identity_parts(event.text))
    if isinstance(event, SubjectProfile.ExperienceRecorded):
        fields = (event.situation, event.action, event.outcome, event.insight)
        return ("experience", _identity_parts(*fields))
    return None


def _erased(proposal: Any, erased: ErasedItems) -> bool:
    """Whether an erasure took the item ``proposal`` would record (it cites evidence)."""
    if not proposal.evidence:
        return False
    identity = proposal_identity(proposal)
    return identity is not None and erased(identity[0], identity[1], tuple(proposal.evidence))


def _revealed_for(evidence: tuple[str, ...], revealed: dict[str, set[str]]) -> list[str]:
    """The categories revealed by the captures a memory cites."""
    return sorted({c for e in evidence for c in revealed.get(e, ())})


def _evidence_label(
    evidence: tuple[str, ...], explicit: bool, confidence: float, *, reported: bool = False
) -> tuple[str, float]:
    """Apply I1: no evidence means inferred, with confidence capped.

    A statement somebody else made about the subject is ``reported``, even when the
    extractor called it explicit: only the subject's own words are explicit.
    """
    confidence = clamp(confidence)
    if not evidence:
        return Provenance.INFERRED.value, min(confidence, INFERRED_CONFIDENCE_CAP)
    if reported:
        return Provenance.REPORTED.value, confidence
    return (Provenance.EXPLICIT if explicit else Provenance.INFERRED).value, confidence


#: Which provenance wins when an item is observed again: the subject's own word first.
_PROVENANCE_RANK = {
    Provenance.EXPLICIT.value: 2,
    Provenance.REPORTED.value: 1,
    Provenance.INFERRED.value: 0,
}


@dataclass(frozen=True)
class ConsentState:
    """A consent in force, as the aggregate keeps it (the gate reads it)."""

    app_id: str
    categories: tuple[str, ...]
    purposes: tuple[str, ...]
    legal_basis: str
    granted_at: datetime
    expires_at: datetime | None

    def __post_init__(self) -> None:
        # Snapshots store tuples as JSON lists; the value object is the same either way.
        object.__setattr__(self, "categories", tuple(self.categories))
        object.__setattr__(self, "purposes", tuple(self.purposes))


@dataclass(frozen=True)
class AttributeState:
    """One attribute as the aggregate keeps it, to decide merges, conflicts and erasures.

    ``evidence`` keeps the newest MAX_EVIDENCE_IN_AGGREGATE capture ids (the read side
    keeps them all).
    """

    key: str
    category: str
    value: str
    norm: str
    confidence: float
    provenance: str
    evidence: tuple[str, ...]
    status: str
    owner_agent: str
    sharing: str
    author: str
    first_observed_at: datetime
    last_observed_at: datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "evidence", tuple(self.evidence)[-MAX_EVIDENCE_IN_AGGREGATE:])


@dataclass(frozen=True)
class IntentState:
    """An active intent as the aggregate keeps it (matching, reinforcing, expiring)."""

    norm: str
    category: str
    evidence: tuple[str, ...]
    confidence: float
    expires_at: datetime | None
    owner_agent: str
    #: Snapshots taken before 2026-12-05 lack it: such an intent is matched as private,
    #: by its owner agent's proposals only (fail closed; its events keep the real value).
    sharing: str = "private"

    def __post_init__(self) -> None:
        object.__setattr__(self, "evidence", tuple(self.evidence)[-MAX_EVIDENCE_IN_AGGREGATE:])


#: The value objects of the aggregate's state, which its snapshots hold.
STATE_VALUE_TYPES: tuple[type, ...] = (ConsentState, AttributeState, IntentState)


class SubjectProfile(Aggregate):
    """Everything uprof knows about one data subject, as a stream of facts."""

    #: Version 2 keeps its state in value objects (ConsentState, AttributeState,
    #: IntentState) instead of dicts; ``upcast_v1_v2`` reads the snapshots taken before.
    #: Events are unchanged: only snapshots store the aggregate's state.
    #: Version 3 adds ``archived_memories``; ``upcast_v2_v3`` gives older snapshots none.
    #: Version 4 adds ``quarantined``; ``upcast_v3_v4`` gives older snapshots none.
    class_version = 4

    class Event(Aggregate.Event):
        """Every event of a subject's stream but its opening (``Registered``): each
        applies to the profile its earlier rows built."""

        def mutate(self, aggregate: Any) -> Any:
            # ``Registered`` inherits this class before the library's creation mutate.
            if aggregate is None and not isinstance(self, Aggregate.Created):
                # The first row read is not the stream's opening (nor a snapshot): the
                # rows before it were deleted, or it overwrote the opening (a plaintext
                # verdict or tombstone needs no key). Damage, named as such, rather
                # than the event library's bare ``assert aggregate is not None``; and
                # never "erased" for a subject that was not (review of 0130, bug GC).
                raise StoredDataDamagedError(
                    f"stored event at version {self.originator_version} is the first of "
                    "this subject's stream, which does not begin with its opening "
                    "(damaged or altered storage)"
                )
            return super().mutate(aggregate)

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> None:
        state["consents"] = {i: ConsentState(**c) for i, c in state["consents"].items()}
        state["attributes"] = {
            i: AttributeState(
                key=a["key"],
                category=a["category"],
                value=a["value"],
                norm=a["norm"],
                confidence=a["confidence"],
                provenance=a["provenance"],
                evidence=a.get("evidence", ()),
                status=a["status"],
                owner_agent=a.get("owner_agent", ""),
                sharing=a.get("sharing", "private"),
                author=a.get("author", ""),
                first_observed_at=a.get("first_observed_at", a["last_observed_at"]),
                last_observed_at=a["last_observed_at"],
            )
            for i, a in state["attributes"].items()
        }
        state["intents"] = {
            i: IntentState(
                norm=x["norm"],
                category=x.get("category", ""),
                evidence=x.get("evidence", ()),
                confidence=x["confidence"],
                expires_at=x["expires_at"],
                owner_agent=x.get("owner_agent", ""),
                sharing=x.get("sharing", "private"),
            )
            for i, x in state["intents"].items()
        }

    @staticmethod
    def upcast_v2_v3(state: dict[str, Any]) -> None:
        # Snapshots before version 3 did not keep archived memories: such a subject's
        # memories archived before its snapshot are not known here (the views know them,
        # and the decay job chooses only among the ones they show active).
        state["archived_memories"] = set()

    @staticmethod
    def upcast_v3_v4(state: dict[str, Any]) -> None:
        # Quarantine came with version 4: no capture was quarantined before it.
        state["quarantined"] = {}

    if TYPE_CHECKING:
        # The @event("Name") decorators below create these classes when the class body
        # runs; declaring them here lets the type checker see them (nothing at run time).
        Registered: ClassVar[type[Aggregate.Event]]
        ConsentGranted: ClassVar[type[Aggregate.Event]]
        ConsentWithdrawn: ClassVar[type[Aggregate.Event]]
        AttributeRecorded: ClassVar[type[Aggregate.Event]]
        AttributeReinforced: ClassVar[type[Aggregate.Event]]
        AttributeConflictFlagged: ClassVar[type[Aggregate.Event]]
        AttributeSuperseded: ClassVar[type[Aggregate.Event]]
        MemoriesArchived: ClassVar[type[Aggregate.Event]]
        IntentRecorded: ClassVar[type[Aggregate.Event]]
        IntentReinforced: ClassVar[type[Aggregate.Event]]
        IntentStatusChanged: ClassVar[type[Aggregate.Event]]
        SliceServed: ClassVar[type[Aggregate.Event]]
        RequestsRecorded: ClassVar[type[Aggregate.Event]]
        ItemsErased: ClassVar[type[Aggregate.Event]]
        AttributeRestated: ClassVar[type[Aggregate.Event]]
        CaptureErased: ClassVar[type[Aggregate.Event]]
        ErasedRefsNoted: ClassVar[type[Aggregate.Event]]
        SubjectErased: ClassVar[type[Aggregate.Event]]
        CaptureQuarantined: ClassVar[type[Aggregate.Event]]
        CaptureReleased: ClassVar[type[Aggregate.Event]]

    # The metaclass makes every event a frozen dataclass; the decorator says so to the type
    # checker, so constructing one is checked field by field.
    @dataclass(frozen=True)
    class ContentShredded(Aggregate.Event):
        """What an event reads as once the key that sealed it is destroyed.

        Built by the key mapper, never raised by a command: it keeps the stream's
        version numbering intact and applies nothing (its content is gone).
        """

        topic: str

        def mutate(self, aggregate: Any) -> Any:
            if aggregate is None and self._opens_the_stream():
                # The stream's first row (its creation, or a snapshot) reads as shredded:
                # the subject's keys were destroyed after the loader asked whether it
                # was erased (another process's erasure in between). Say so, rather than
                # the event library's bare ``assert aggregate is not None`` (bug EX).
                raise SubjectErasedError("this subject has been erased")
            # Any other first row is damage (``SubjectProfile.Event``): a capture whose
            # own key an event erasure destroyed reads as shredded too, in a subject
            # that was never erased (bug GC).
            return super().mutate(aggregate)

        def _opens_the_stream(self) -> bool:
            if self.topic == get_topic(SubjectProfile.Registered):
                return self.originator_version == 1
            return self.topic == get_topic(SubjectProfile.Snapshot)

        def apply(self, aggregate: Any) -> None:
            pass

    @dataclass(frozen=True)
    class DamagedEventQuarantined(Aggregate.Event):
        """The pipeline set aside a stored event of this stream that does not open
        (its ciphertext is damaged: storage, not our code), by its log position.

        Built by the extraction batch from the stored rows' plaintext metadata, never by
        a command (the stream cannot be loaded while the damaged event is in it), and
        stored in plaintext: ids and a version only. Applies nothing: the quarantine is
        the log's, folded by ``uprof.services.quarantine``.
        """

        notification_id: int
        damaged_version: int
        quarantined_at: datetime

        def apply(self, aggregate: Any) -> None:
            pass

    @event("Registered")
    def __init__(self, id: uuid.UUID, tenant: str) -> None:
        """Open the stream; ``id`` comes from the key store (random, never derived)."""
        self.tenant = tenant
        self.consents: dict[str, ConsentState] = {}
        self.attributes: dict[str, AttributeState] = {}
        self.intents: dict[str, IntentState] = {}
        #: Ids of the memories archived and not erased since (snapshots keep them as a
        #: sorted list): a second archive of the same memory is a no-op.
        self.archived_memories: set[str] = set()
        #: Captures whose extraction failed on every attempt (capture id -> the stage and
        #: the error's class, ``extract:RuntimeError``): skipped by the pipeline until an
        #: operator retries them (``release_capture``). Ids and class names only.
        self.quarantined: dict[str, str] = {}
        self.capture_count = 0
        self.memory_count = 0
        self.erased = False

    # ------------------------------------------------------------------ consent

    def grant_consent(
        self,
        *,
        app_id: str,
        categories: tuple[str, ...],
        purposes: tuple[str, ...],
        legal_basis: str,
        granted_at: datetime,
        expires_at: datetime | None = None,
        notice_version: str = "",
        collected_by: str = "",
    ) -> str:
        """Record a consent in force from ``granted_at``; returns its id.

        ``collected_by`` names the record the consent rests on (an app's own
        consent record, or the principal that recorded it).
        """
        self._refuse_if_erased()
        if not app_id:
            raise InvalidInputError("consent.app_id must not be empty")
        if not categories or not purposes:
            raise InvalidInputError("consent needs at least one category and one purpose")
        for category in categories:
            if category != "*":
                check_category(category)
        if expires_at is not None and expires_at <= granted_at:
            raise InvalidInputError("consent.expires_at must be after granted_at")
        consent_id = _new_id()
        self._consent_granted(
            consent_id=consent_id,
            app_id=app_id,
            categories=sorted(set(categories)),
            purposes=sorted(set(purposes)),
            legal_basis=legal_basis or "consent",
            granted_at=granted_at,
            expires_at=expires_at,
            notice_version=notice_version,
            collected_by=collected_by,
        )
        return consent_id

    @event("ConsentGranted")
    def _consent_granted(
        self,
        consent_id: str,
        app_id: str,
        categories: list[str],
        purposes: list[str],
        legal_basis: str,
        granted_at: datetime,
        expires_at: datetime | None,
        notice_version: str,
        collected_by: str = "",  # absent from consents recorded before it existed
    ) -> None:
        self.consents[consent_id] = ConsentState(
            app_id=app_id,
            categories=tuple(categories),
            purposes=tuple(purposes),
            legal_basis=legal_basis,
            granted_at=granted_at,
            expires_at=expires_at,
        )

    def withdraw_consent(
        self, *, consent_id: str, withdrawn_at: datetime, erase_requested: bool = False
    ) -> None:
        """Withdraw one consent; collection under it stops with the next request."""
        self._refuse_if_erased()
        if consent_id not in self.consents:
            raise InvalidInputError(f"no consent {consent_id!r} in force for this subject")
        self._consent_withdrawn(
            consent_id=consent_id, withdrawn_at=withdrawn_at, erase_requested=erase_requested
        )

    @event("ConsentWithdrawn")
    def _consent_withdrawn(
        self, consent_id: str, withdrawn_at: datetime, erase_requested: bool
    ) -> None:
        self.consents.pop(consent_id, None)

    def consents_held(self) -> list[ConsentGrant]:
        """Every consent not withdrawn, expired ones included (they may still be withdrawn)."""
        return [
            ConsentGrant(
                consent_id=consent_id,
                app_id=c.app_id,
                categories=c.categories,
                purposes=c.purposes,
                legal_basis=c.legal_basis,
                granted_at=c.granted_at,
                expires_at=c.expires_at,
            )
            for consent_id, c in sorted(self.consents.items())
        ]

    def consents_in_force(self, at: datetime) -> list[ConsentGrant]:
        return [g for g in self.consents_held() if g.expires_at is None or at < g.expires_at]

    def has_consent(self, *, app_id: str, category: str, purpose: str, at: datetime) -> bool:
        return any(
            g.covers(app_id=app_id, category=category, purpose=purpose, at=at)
            for g in self.consents_in_force(at)
        )

    # ------------------------------------------------------------------ capture

    def require_capture_consent(self, interaction: Interaction, now: datetime) -> None:
        """Raise ConsentRequiredError unless a consent in force at ``now`` lets this app
        collect conversation data for the interaction's purpose (records nothing)."""
        if not self.has_consent(
            app_id=interaction.app_id,
            category=CAPTURE_CATEGORY,
            purpose=interaction.purpose,
            at=now,
        ):
            raise capture_consent_refusal(interaction)

    def capture(self, interaction: Interaction, *, now: datetime) -> str:
        """Pass the consent gate and record the interaction; returns the capture id.

        Raises ConsentRequiredError (and records nothing) when no consent in force
        at ``now`` lets this app collect conversation data for this purpose.
        """
        self._refuse_if_erased()
        self.require_capture_consent(interaction, now)
        capture_id = _new_id()
        self._interaction_captured(
            capture_id=capture_id,
            app_id=interaction.app_id,
            agent_id=interaction.agent_id,
            agent_type=interaction.agent_type,
            session_id=interaction.session_id,
            actor=interaction.actor,
            user_input=interaction.user_input,
            agent_response=interaction.agent_response,
            occurred_at=interaction.occurred_at,
            source_ref=interaction.source_ref,
            purpose=interaction.purpose,
            sharing=SharingPolicy.parse(interaction.sharing).render(),
            context=dict(interaction.context),
        )
        return capture_id

    @dataclass(frozen=True)
    class InteractionCaptured(Aggregate.Event):
        """An interaction passed the consent gate and was recorded (sealed with its own key)."""

        capture_id: str
        app_id: str
        agent_id: str
        agent_type: str
        session_id: str
        actor: str
        user_input: str
        agent_response: str
        occurred_at: datetime
        source_ref: str
        purpose: str
        sharing: str
        context: dict[str, str]

    @event(InteractionCaptured)
    def _interaction_captured(
        self,
        capture_id: str,
        app_id: str,
        agent_id: str,
        agent_type: str,
        session_id: str,
        actor: str,
        user_input: str,
        agent_response: str,
        occurred_at: datetime,
        source_ref: str,
        purpose: str,
        sharing: str,
        context: dict[str, str],
    ) -> None:
        self.capture_count += 1

    # --------------------------------------------------------------- extraction

    def apply_proposals(
        self,
        batch: ProposalBatch,
        *,
        observed_at: datetime,
        now: datetime,
        erased: ErasedItems | None = None,
    ) -> int:
        """Run the update engine over validated proposals; returns how many were applied.

        Evidence ids in ``batch`` must already have been checked by the kernel
        (they exist and belong to this subject). Proposals in a category the app
        holds no consent for at ``now`` are dropped (I2), and so are those ``erased``
        says an erasure took: an item erased without its evidence is not born again
        from the same captures (a re-extraction after a restore, an app proposing it
        again), whatever id it would get.
        """
        self._refuse_if_erased()
        applied = 0
        revealed = self._revealed_by_capture(batch)
        for proposal in batch.proposals:
            if erased is not None and _erased(proposal, erased):
                continue
            if isinstance(proposal, AttributeProposal):
                applied += self._propose_attribute(proposal, batch, observed_at, now)
            elif isinstance(proposal, MemoryProposal):
                applied += self._propose_memory(proposal, batch, observed_at, now, revealed)
            elif isinstance(proposal, IntentProposal):
                applied += self._propose_intent(proposal, batch, observed_at, now)
            elif isinstance(proposal, IntentUpdateProposal):
                applied += self._propose_intent_update(proposal, batch, observed_at, now)
            elif isinstance(proposal, ExperienceProposal):
                applied += self._propose_experience(proposal, batch, observed_at, now, revealed)
        return applied

    def _revealed_by_capture(self, batch: ProposalBatch) -> dict[str, set[str]]:
        """Capture id -> categories of the attributes and intents that cite it.

        From this batch (applied or not: an attribute dropped for want of consent is
        still in the words of the capture) and from what the aggregate already holds.
        A memory citing the capture carries them all (decision 0016).
        """
        revealed: dict[str, set[str]] = {}

        def add(evidence: Any, category: str | None) -> None:
            if category in CATEGORIES:
                for capture_id in evidence:
                    revealed.setdefault(capture_id, set()).add(category)

        for p in batch.proposals:
            if isinstance(p, AttributeProposal):
                spec = ATTRIBUTE_KEYS.get(p.key)
                add(p.evidence, spec.category if spec else None)
            elif isinstance(p, IntentProposal):
                add(p.evidence, p.category)
        cited = {e for p in batch.proposals for e in p.evidence}
        if cited:
            for a in self.attributes.values():
                add(cited.intersection(a.evidence), a.category)
            for intent in self.intents.values():
                add(cited.intersection(intent.evidence), intent.category or None)
        return revealed

    def _consented(self, batch: ProposalBatch, category: str, now: datetime) -> bool:
        return self.has_consent(
            app_id=batch.app_id, category=category, purpose=batch.purpose, at=now
        )

    @staticmethod
    def _seen_by(batch: ProposalBatch, owner_agent: str, sharing: str) -> bool:
        """Whether the batch's agent may see an item, and so match it (I4).

        A proposal reinforces, retracts, supersedes, conflicts with or moves only items
        its agent may see: matched among all items, another agent's private attribute was
        retracted or superseded by a proposal it could not see, and the answer (applied
        1 or 0) told the proposer that such a value existed; another agent's private
        intent took the proposer's evidence and left it no intent of its own. The slices'
        rule with no agent type, as the door binds intent updates (``shared:types`` is
        then the owner's alone).
        """
        return SharingPolicy.parse(sharing).allows(
            owner_agent=owner_agent, reader_agent=batch.owner_agent, reader_agent_type=""
        )

    def _propose_attribute(
        self, p: AttributeProposal, batch: ProposalBatch, observed_at: datetime, now: datetime
    ) -> int:
        spec = attribute_spec(p.key)
        if not self._consented(batch, spec.category, now):
            return 0
        value = p.value.strip()
        norm = normalise_value(value)
        if not norm:
            return 0
        provenance, confidence = _evidence_label(
            p.evidence, p.explicit, p.confidence, reported=p.reported
        )
        same_key = {
            item_id: a
            for item_id, a in self.attributes.items()
            if a.key == p.key
            and a.status != AttributeStatus.SUPERSEDED.value
            and self._seen_by(batch, a.owner_agent, a.sharing)
        }
        match = next((i for i, a in same_key.items() if a.norm == norm), None)
        if p.negated:
            if match is None:
                return 0
            self._attribute_superseded(item_id=match, superseded_by="", reason="retracted")
            return 1
        if match is not None:
            old = same_key[match]
            base = decayed(
                old.confidence,
                since=old.last_observed_at,
                now=observed_at,
                half_life_days=ATTRIBUTE_HALF_LIFE_DAYS,
            )
            strongest = max((old.provenance, provenance), key=lambda v: _PROVENANCE_RANK.get(v, 0))
            new_conf = combine(base, confidence)
            if not old.evidence and not p.evidence:
                new_conf = min(new_conf, INFERRED_CONFIDENCE_CAP)
            self._attribute_reinforced(
                item_id=match,
                confidence=round(new_conf, 6),
                evidence=list(p.evidence),
                provenance=strongest,
                observed_at=observed_at,
            )
            return 1
        item_id = _new_id()
        conflicting = spec.single_valued and bool(same_key) and not p.supersedes
        self._attribute_recorded(
            item_id=item_id,
            key=p.key,
            category=spec.category,
            value=value,
            norm=norm,
            confidence=round(confidence, 6),
            provenance=provenance,
            evidence=list(p.evidence),
            owner_agent=batch.owner_agent,
            sharing=SharingPolicy.parse(batch.sharing).render(),
            author=batch.author,
            status=(AttributeStatus.CONFLICTING if conflicting else AttributeStatus.CURRENT).value,
            observed_at=observed_at,
        )
        if spec.single_valued and same_key:
            if p.supersedes:
                for old_id in sorted(same_key):
                    self._attribute_superseded(
                        item_id=old_id, superseded_by=item_id, reason="superseded"
                    )
            else:
                self._attribute_conflict_flagged(item_id=item_id, conflicts_with=sorted(same_key))
        return 1

    @event("AttributeRecorded")
    def _attribute_recorded(
        self,
        item_id: str,
        key: str,
        category: str,
        value: str,
        norm: str,
        confidence: float,
        provenance: str,
        evidence: list[str],
        owner_agent: str,
        sharing: str,
        author: str,
        status: str,
        observed_at: datetime,
    ) -> None:
        self.attributes[item_id] = AttributeState(
            key=key,
            category=category,
            value=value,
            norm=norm,
            confidence=confidence,
            provenance=provenance,
            evidence=tuple(evidence),
            status=status,
            owner_agent=owner_agent,
            sharing=sharing,
            author=author,
            first_observed_at=observed_at,
            last_observed_at=observed_at,
        )

    @event("AttributeReinforced")
    def _attribute_reinforced(
        self,
        item_id: str,
        confidence: float,
        evidence: list[str],
        provenance: str,
        observed_at: datetime,
    ) -> None:
        a = self.attributes.get(item_id)
        if a is None:  # its recording event was shredded with an erased capture
            return
        self.attributes[item_id] = replace(
            a,
            confidence=confidence,
            provenance=provenance,
            evidence=(*a.evidence, *(e for e in evidence if e not in a.evidence)),
            last_observed_at=max(a.last_observed_at, observed_at),
        )

    @event("AttributeConflictFlagged")
    def _attribute_conflict_flagged(self, item_id: str, conflicts_with: list[str]) -> None:
        for other in [item_id, *conflicts_with]:
            self._set_attribute_status(other, AttributeStatus.CONFLICTING)

    @event("AttributeSuperseded")
    def _attribute_superseded(self, item_id: str, superseded_by: str, reason: str) -> None:
        self._set_attribute_status(item_id, AttributeStatus.SUPERSEDED)
        # A winner of a conflict that is resolved by supersession is current again.
        if superseded_by:
            self._set_attribute_status(superseded_by, AttributeStatus.CURRENT)

    def _set_attribute_status(self, item_id: str, status: AttributeStatus) -> None:
        if item_id in self.attributes:  # its recording may have been shredded
            self.attributes[item_id] = replace(self.attributes[item_id], status=status.value)

    # ------------------------------------------------------------------ memories

    def _propose_memory(
        self,
        p: MemoryProposal,
        batch: ProposalBatch,
        observed_at: datetime,
        now: datetime,
        revealed: dict[str, set[str]],
    ) -> int:
        category = check_category(p.category)
        declared = [check_category(c) for c in p.categories]
        # Recording needs the consent of the primary category (the one the capture's
        # own consent covers for extractor memories); serving needs all (decision 0016).
        if not p.text.strip() or not self._consented(batch, category, now):
            return 0
        provenance, importance = _evidence_label(p.evidence, True, p.importance)
        text = p.text.strip()
        self._memory_recorded(
            item_id=_new_id(),
            text=text,
            category=category,
            categories=memory_categories(
                category,
                revealed=[*declared, *_revealed_for(p.evidence, revealed)],
                texts=[text],
            ),
            importance=round(importance, 6),
            provenance=provenance,
            evidence=list(p.evidence),
            source_refs=list(p.source_refs),
            owner_agent=batch.owner_agent,
            sharing=SharingPolicy.parse(batch.sharing).render(),
            author=batch.author,
            occurred_at=p.occurred_at or observed_at,
            span=list(p.span) if p.span else [],
        )
        return 1

    class MemoryRecorded(Aggregate.Event):
        """A memory was recorded. Version 2 added ``categories`` (decision 0016), version 3
        ``span``: [start, end) of the memory's text in its capture as the extractor read
        it, or [] when not known (decision 0020)."""

        class_version = 3

        item_id: str
        text: str
        category: str
        categories: list[str]
        importance: float
        provenance: str
        evidence: list[str]
        source_refs: list[str]
        owner_agent: str
        sharing: str
        author: str
        occurred_at: datetime
        span: list[int]

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            # A version-1 memory knew only its primary category; the projector adds
            # what the detector finds in its text, and reads add its capture's items.
            state["categories"] = [state["category"]]

        @staticmethod
        def upcast_v2_v3(state: dict[str, Any]) -> None:
            # Memories before version 3 were one per capture (cut at 600 characters).
            state["span"] = []

    @event(MemoryRecorded)
    def _memory_recorded(
        self,
        item_id: str,
        text: str,
        category: str,
        categories: list[str],
        importance: float,
        provenance: str,
        evidence: list[str],
        source_refs: list[str],
        owner_agent: str,
        sharing: str,
        author: str,
        occurred_at: datetime,
        span: list[int],
    ) -> None:
        self.memory_count += 1

    def archive_memories(self, item_ids: list[str], *, reason: str) -> list[str]:
        """Move cold memories out of retrieval (MemoryOS eviction); they stay as evidence.

        Returns the ids archived now: those already archived are left out, so a command
        decided on views that do not show an archive yet (another process's, or this
        one's before a retry) does not archive the same memory twice.
        """
        self._refuse_if_erased()
        ids = sorted(set(item_ids) - self.archived_memories)
        if ids:
            self._memories_archived(item_ids=ids, reason=reason)
        return ids

    @event("MemoriesArchived")
    def _memories_archived(self, item_ids: list[str], reason: str) -> None:
        self.archived_memories.update(item_ids)

    # ------------------------------------------------------------------- intents

    def _propose_intent(
        self, p: IntentProposal, batch: ProposalBatch, observed_at: datetime, now: datetime
    ) -> int:
        category = check_category(p.category)
        norm = normalise_value(p.description)
        if not norm or not self._consented(batch, category, now):
            return 0
        provenance, confidence = _evidence_label(p.evidence, True, p.confidence)
        for item_id, intent in self.intents.items():
            if intent.norm == norm and self._seen_by(batch, intent.owner_agent, intent.sharing):
                self._intent_reinforced(
                    item_id=item_id,
                    confidence=round(combine(intent.confidence, confidence), 6),
                    evidence=list(p.evidence),
                    expires_at=p.expires_at or intent.expires_at,
                    observed_at=observed_at,
                )
                return 1
        self._intent_recorded(
            item_id=_new_id(),
            description=p.description.strip(),
            norm=norm,
            category=category,
            confidence=round(confidence, 6),
            provenance=provenance,
            evidence=list(p.evidence),
            owner_agent=batch.owner_agent,
            sharing=SharingPolicy.parse(batch.sharing).render(),
            author=batch.author,
            expires_at=p.expires_at,
            observed_at=observed_at,
        )
        return 1

    @event("IntentRecorded")
    def _intent_recorded(
        self,
        item_id: str,
        description: str,
        norm: str,
        category: str,
        confidence: float,
        provenance: str,
        evidence: list[str],
        owner_agent: str,
        sharing: str,
        author: str,
        expires_at: datetime | None,
        observed_at: datetime,
    ) -> None:
        self.intents[item_id] = IntentState(
            norm=norm,
            category=category,
            evidence=tuple(evidence),
            confidence=confidence,
            expires_at=expires_at,
            owner_agent=owner_agent,
            sharing=sharing,
        )

    @event("IntentReinforced")
    def _intent_reinforced(
        self,
        item_id: str,
        confidence: float,
        evidence: list[str],
        expires_at: datetime | None,
        observed_at: datetime,
    ) -> None:
        if item_id in self.intents:
            self.intents[item_id] = replace(
                self.intents[item_id], confidence=confidence, expires_at=expires_at
            )

    def _propose_intent_update(
        self, p: IntentUpdateProposal, batch: ProposalBatch, observed_at: datetime, now: datetime
    ) -> int:
        seen = {
            item_id: intent
            for item_id, intent in self.intents.items()
            if self._seen_by(batch, intent.owner_agent, intent.sharing)
        }
        item_id = p.intent_id or self._find_intent(p.description, seen)
        if not item_id:
            return 0
        intent = seen.get(item_id)
        if intent is None:  # named by id: one not active and one not seen answer alike
            raise IntentTransitionError(f"intent {item_id!r} is not active")
        if not self._consented(batch, intent.category, now):
            return 0  # I2: moving an intent uses its category, like proposing one
        self.change_intent_status(item_id, p.status, evidence=p.evidence, observed_at=observed_at)
        return 1

    @staticmethod
    def _find_intent(description: str, intents: dict[str, IntentState]) -> str:
        """Match an active intent by description: equal, or one contains the other."""
        return match_described(description, {i: intent.norm for i, intent in intents.items()})

    def change_intent_status(
        self,
        item_id: str,
        status: IntentStatus,
        *,
        evidence: tuple[str, ...] = (),
        observed_at: datetime,
    ) -> None:
        """Move an active intent to fulfilled, abandoned or expired."""
        self._refuse_if_erased()
        if item_id not in self.intents:
            raise IntentTransitionError(f"intent {item_id!r} is not active")
        if status == IntentStatus.ACTIVE:
            raise IntentTransitionError("an active intent cannot become active again")
        self._intent_status_changed(
            item_id=item_id, status=status.value, evidence=list(evidence), observed_at=observed_at
        )

    @event("IntentStatusChanged")
    def _intent_status_changed(
        self, item_id: str, status: str, evidence: list[str], observed_at: datetime
    ) -> None:
        self.intents.pop(item_id, None)

    def expire_intents(self, now: datetime) -> list[str]:
        """Expire every active intent whose deadline has passed; returns their ids."""
        due = sorted(
            item_id
            for item_id, intent in self.intents.items()
            if intent.expires_at is not None and intent.expires_at <= now
        )
        for item_id in due:
            self.change_intent_status(item_id, IntentStatus.EXPIRED, observed_at=now)
        return due

    # ---------------------------------------------------------------- experience

    def _propose_experience(
        self,
        p: ExperienceProposal,
        batch: ProposalBatch,
        observed_at: datetime,
        now: datetime,
        revealed: dict[str, set[str]],
    ) -> int:
        declared = [check_category(c) for c in p.categories]
        if not self._consented(batch, EXPERIENCE_CATEGORY, now):
            return 0
        if not (p.situation.strip() and p.action.strip()):
            raise InvalidInputError("experience.situation and experience.action are required")
        provenance, confidence = _evidence_label(p.evidence, True, p.confidence)
        fields = [p.situation.strip(), p.action.strip(), p.outcome.strip(), p.insight.strip()]
        self._experience_recorded(
            item_id=_new_id(),
            situation=fields[0],
            action=fields[1],
            outcome=fields[2],
            insight=fields[3],
            categories=memory_categories(
                EXPERIENCE_CATEGORY,
                revealed=[*declared, *_revealed_for(p.evidence, revealed)],
                texts=fields,
            ),
            confidence=round(confidence, 6),
            provenance=provenance,
            evidence=list(p.evidence),
            owner_agent=batch.owner_agent,
            sharing=SharingPolicy.parse(batch.sharing).render(),
            author=batch.author,
            observed_at=observed_at,
        )
        return 1

    class ExperienceRecorded(Aggregate.Event):
        """An experience memory was recorded. Version 2 added ``categories`` (decision 0016)."""

        class_version = 2

        item_id: str
        situation: str
        action: str
        outcome: str
        insight: str
        categories: list[str]
        confidence: float
        provenance: str
        evidence: list[str]
        owner_agent: str
        sharing: str
        author: str
        observed_at: datetime

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["categories"] = [EXPERIENCE_CATEGORY]

    @event(ExperienceRecorded)
    def _experience_recorded(
        self,
        item_id: str,
        situation: str,
        action: str,
        outcome: str,
        insight: str,
        categories: list[str],
        confidence: float,
        provenance: str,
        evidence: list[str],
        owner_agent: str,
        sharing: str,
        author: str,
        observed_at: datetime,
    ) -> None:
        self.memory_count += 1

    # ------------------------------------------------------------------ reading

    def record_slice_served(
        self,
        *,
        app_id: str,
        agent_id: str,
        purpose: str,
        item_ids: list[str],
        served_at: datetime,
        budget_tokens: int,
        n_tokens: int,
    ) -> None:
        """Record who read which items for which purpose (feeds heat and audit)."""
        self._refuse_if_erased()
        self._slice_served(
            app_id=app_id,
            agent_id=agent_id,
            purpose=purpose,
            item_ids=list(item_ids),
            served_at=served_at,
            budget_tokens=budget_tokens,
            n_tokens=n_tokens,
        )

    @event("SliceServed")
    def _slice_served(
        self,
        app_id: str,
        agent_id: str,
        purpose: str,
        item_ids: list[str],
        served_at: datetime,
        budget_tokens: int,
        n_tokens: int,
    ) -> None:
        pass

    # -------------------------------------------------------------- idempotency

    def _request_tokens(self) -> dict[str, dict[str, Any]]:
        # Snapshots taken before request tokens existed have none.
        tokens: dict[str, dict[str, Any]] = self.__dict__.setdefault("request_tokens", {})
        return tokens

    def recorded_request(
        self, token: str, *, now: datetime, window_s: float
    ) -> dict[str, Any] | None:
        """The result recorded for a retried write's token, if it is still in the window.

        The token is a keyed hash of (tenant, app, idempotency key) made by the kernel;
        checking it here, in the stream that the write goes to, is what makes a retry
        exactly-once across processes: two writers with one token cannot both save,
        since the second's save loses the version race and its retry finds the token.
        """
        entry = self._request_tokens().get(token)
        if entry is None or entry["recorded_at"] < now - timedelta(seconds=window_s):
            return None
        result: dict[str, Any] = entry["result"]
        return result

    def record_request(
        self, token: str, result: dict[str, Any], *, now: datetime, window_s: float
    ) -> None:
        """Record that the write of ``token`` happened, with its result (ids only)."""
        self.record_requests({token: result}, now=now, window_s=window_s)

    def record_requests(
        self, results: dict[str, dict[str, Any]], *, now: datetime, window_s: float
    ) -> None:
        """Record several tokens in one event (an import batch: one per record)."""
        self._refuse_if_erased()
        if results:
            self._requests_recorded(
                results={t: dict(r) for t, r in results.items()},
                recorded_at=now,
                window_s=float(window_s),
            )

    @event("RequestsRecorded")
    def _requests_recorded(
        self, results: dict[str, dict[str, Any]], recorded_at: datetime, window_s: float
    ) -> None:
        tokens = self._request_tokens()
        # Bounded: tokens older than the window are forgotten (deterministically, on replay too).
        horizon = recorded_at - timedelta(seconds=window_s)
        for old in [t for t, e in tokens.items() if e["recorded_at"] < horizon]:
            del tokens[old]
        for token, result in results.items():
            tokens[token] = {"result": result, "recorded_at": recorded_at}

    # -------------------------------------------------------------- quarantine

    def quarantine_capture(
        self, capture_id: str, *, stage: str, error: str, attempts: int, now: datetime
    ) -> bool:
        """Set a capture aside whose extraction failed on every attempt; False when it is
        set aside already (a second worker's verdict changes nothing).

        The event cites the capture as its evidence, so the key mapper seals it under the
        capture's own key: erasing the capture (or the subject) shreds it too. It holds
        the capture's id, the stage that failed and the error's class, never a message
        (an extractor's message may quote the capture)."""
        self._refuse_if_erased()
        if capture_id in self.quarantined:
            return False
        self._capture_quarantined(
            capture_id=capture_id,
            stage=stage,
            error=error,
            attempts=attempts,
            quarantined_at=now,
            evidence=[capture_id],
        )
        return True

    @event("CaptureQuarantined")
    def _capture_quarantined(
        self,
        capture_id: str,
        stage: str,
        error: str,
        attempts: int,
        quarantined_at: datetime,
        evidence: list[str],
    ) -> None:
        self.quarantined[capture_id] = f"{stage}:{error}"

    def release_capture(self, capture_id: str, *, now: datetime) -> bool:
        """Take a capture out of quarantine (its extraction was retried and succeeded, and
        its results are saved with this event); False when it is not quarantined."""
        self._refuse_if_erased()
        if capture_id not in self.quarantined:
            return False
        self._capture_released(capture_id=capture_id, released_at=now, evidence=[capture_id])
        return True

    @event("CaptureReleased")
    def _capture_released(
        self, capture_id: str, released_at: datetime, evidence: list[str]
    ) -> None:
        self.quarantined.pop(capture_id, None)

    # ------------------------------------------------------------------ erasure

    def erase_items(self, item_ids: list[str], *, reason: str) -> None:
        """Remove items from the profile; the derived stores purge them (ids only)."""
        self._refuse_if_erased()
        ids = sorted(set(item_ids))
        if ids:
            self._items_erased(item_ids=ids, reason=reason)

    @event("ItemsErased")
    def _items_erased(self, item_ids: list[str], reason: str) -> None:
        for item_id in item_ids:
            self.attributes.pop(item_id, None)
            self.intents.pop(item_id, None)
            self.archived_memories.discard(item_id)

    def erase_capture(
        self,
        capture_id: str,
        *,
        cited_by: list[str],
        now: datetime,
        ref_token: str | None = None,
    ) -> dict[str, int]:
        """Erase one captured event and everything derived only from it.

        ``cited_by`` are the memory and intent ids whose evidence cites the capture
        (the read side knows them; this aggregate does not keep memories). An
        attribute that other evidence still backs is restated without this capture,
        with the confidence of what remains, so it survives the capture's shredding.

        ``ref_token`` is the keyed token of the capture's (app, source_ref), when it had
        a ref: the stream keeps it for the subject's life, so an import of the same
        record is skipped however late (bug IC, decision 0147-erased-refs-stay-erased).
        """
        self._refuse_if_erased()
        restated = erased = 0
        doomed = set(cited_by)
        for item_id, a in sorted(self.attributes.items()):
            if capture_id not in a.evidence:
                continue
            remaining = [e for e in a.evidence if e != capture_id]
            if not remaining:
                doomed.add(item_id)
                continue
            # Each remaining observation counts once at the default extraction strength.
            confidence = 0.0
            for _ in remaining:
                confidence = combine(confidence, min(a.confidence, 0.6))
            self._attribute_restated(
                item_id=item_id,
                key=a.key,
                category=a.category,
                value=a.value,
                norm=a.norm,
                confidence=round(confidence, 6),
                provenance=a.provenance,
                evidence=remaining,
                owner_agent=a.owner_agent,
                sharing=a.sharing,
                author=a.author,
                status=a.status,
                first_observed_at=a.first_observed_at,
                observed_at=a.last_observed_at,
            )
            restated += 1
        for item_id, intent in sorted(self.intents.items()):
            if capture_id in intent.evidence:
                doomed.add(item_id)
        if doomed:
            self._items_erased(item_ids=sorted(doomed), reason="evidence-erased")
            erased = len(doomed)
        if ref_token and ref_token not in self._erased_refs():
            # Before the tombstone: a capture erasure's receipt cites its last event.
            self._erased_refs_noted(tokens=[ref_token])
        self._capture_erased(capture_id=capture_id, erased_at=now)
        return {"items_erased": erased, "attributes_restated": restated}

    @event("AttributeRestated")
    def _attribute_restated(
        self,
        item_id: str,
        key: str,
        category: str,
        value: str,
        norm: str,
        confidence: float,
        provenance: str,
        evidence: list[str],
        owner_agent: str,
        sharing: str,
        author: str,
        status: str,
        first_observed_at: datetime,
        observed_at: datetime,
    ) -> None:
        self.attributes[item_id] = AttributeState(
            key=key,
            category=category,
            value=value,
            norm=norm,
            confidence=confidence,
            provenance=provenance,
            evidence=tuple(evidence),
            status=status,
            owner_agent=owner_agent,
            sharing=sharing,
            author=author,
            first_observed_at=first_observed_at,
            last_observed_at=observed_at,
        )

    def _erased_refs(self) -> set[str]:
        # Streams and snapshots from before bug IC's fix have none.
        refs: set[str] = self.__dict__.setdefault("erased_refs", set())
        return refs

    def ref_erased(self, token: str) -> bool:
        """Whether a capture whose (app, source_ref) has this keyed token was erased at
        the subject's request: an import of that record is skipped, with no expiry."""
        return token in self._erased_refs()

    def note_erased_refs(self, tokens: list[str]) -> None:
        """Note erased captures' ref tokens the stream lacks (a restore rolled back the
        erasure's ``ErasedRefsNoted``, bug IO)."""
        self._refuse_if_erased()
        missing = sorted(set(tokens) - self._erased_refs())
        if missing:
            self._erased_refs_noted(tokens=missing)

    @event("ErasedRefsNoted")
    def _erased_refs_noted(self, tokens: list[str]) -> None:
        # Sealed under the subject's key (it names no capture, no evidence): a keyed hash
        # only, and gone with the subject's key when the subject is erased.
        self._erased_refs().update(tokens)

    @event("CaptureErased")
    def _capture_erased(self, capture_id: str, erased_at: datetime) -> None:
        self.capture_count = max(0, self.capture_count - 1)
        self.quarantined.pop(capture_id, None)

    def erase(self, *, request_id: str, basis: str, now: datetime) -> None:
        """Append the tombstone; afterwards the stream refuses every write."""
        self._refuse_if_erased()
        self._subject_erased(request_id=request_id, basis=basis, erased_at=now)

    @event("SubjectErased")
    def _subject_erased(self, request_id: str, basis: str, erased_at: datetime) -> None:
        self.erased = True
        self.consents = {}
        self.attributes = {}
        self.intents = {}
        self.archived_memories = set()
        self.quarantined = {}
        self.erased_refs: set[str] = set()

    def _refuse_if_erased(self) -> None:
        if self.erased:
            raise SubjectErasedError("this subject has been erased")
