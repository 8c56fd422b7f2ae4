"""The SubjectProfile aggregate on its own: no storage, no clock, no network."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.errors import ConsentRequiredError, IntentTransitionError, SubjectErasedError
from domain.normalise import normalise_value
from domain.profile import SubjectProfile, proposal_identity, recorded_identity
from domain.values import (
    INFERRED_CONFIDENCE_CAP,
    AttributeProposal,
    ExperienceProposal,
    IntentProposal,
    IntentStatus,
    IntentUpdateProposal,
    Interaction,
    MemoryProposal,
    ProposalBatch,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
APP = "app:planner"


def profile_with_consent(categories: tuple[str, ...] = ("*",)) -> SubjectProfile:
    p = SubjectProfile(id=uuid.uuid4(), tenant="t")
    p.grant_consent(
        app_id=APP,
        categories=categories,
        purposes=("personalization",),
        legal_basis="consent",
        granted_at=T0,
    )
    return p


def batch(*proposals: object) -> ProposalBatch:
    return ProposalBatch(tuple(proposals), author="test", owner_agent="agent:a", app_id=APP)  # type: ignore[arg-type]


def event_names(p: SubjectProfile) -> list[str]:
    return [type(e).__name__ for e in p.collect_events()]


def test_capture_needs_consent_in_force() -> None:
    p = SubjectProfile(id=uuid.uuid4(), tenant="t")
    interaction = Interaction(app_id=APP, agent_id="a", occurred_at=T0, user_input="hi")
    with pytest.raises(ConsentRequiredError):
        p.capture(interaction, now=T0)
    p.grant_consent(
        app_id=APP,
        categories=("conversation",),
        purposes=("personalization",),
        legal_basis="consent",
        granted_at=T0,
        expires_at=T0 + timedelta(days=1),
    )
    assert p.capture(interaction, now=T0 + timedelta(hours=1))
    with pytest.raises(ConsentRequiredError):
        p.capture(interaction, now=T0 + timedelta(days=2))


def test_single_valued_attribute_conflict_is_kept_not_overwritten() -> None:
    p = profile_with_consent()
    p.apply_proposals(
        batch(AttributeProposal("home_location", "Paris", ("e1",))), observed_at=T0, now=T0
    )
    p.apply_proposals(
        batch(AttributeProposal("home_location", "Rome", ("e2",))), observed_at=T0, now=T0
    )
    values = {a.value: a.status for a in p.attributes.values()}
    assert values == {"Paris": "conflicting", "Rome": "conflicting"}


def test_supersession_resolves_the_old_value() -> None:
    p = profile_with_consent()
    p.apply_proposals(
        batch(AttributeProposal("home_location", "Paris", ("e1",))), observed_at=T0, now=T0
    )
    p.apply_proposals(
        batch(AttributeProposal("home_location", "Rome", ("e2",), supersedes=True)),
        observed_at=T0,
        now=T0,
    )
    values = {a.value: a.status for a in p.attributes.values()}
    assert values == {"Paris": "superseded", "Rome": "current"}


def test_multi_valued_attributes_accumulate() -> None:
    p = profile_with_consent()
    p.apply_proposals(
        batch(
            AttributeProposal("likes", "tea", ("e1",)), AttributeProposal("likes", "jazz", ("e1",))
        ),
        observed_at=T0,
        now=T0,
    )
    assert {a.status for a in p.attributes.values()} == {"current"}


def test_reinforcement_decays_old_confidence_before_combining() -> None:
    fresh, stale = profile_with_consent(), profile_with_consent()
    for p, gap in ((fresh, 0), (stale, 720)):
        p.apply_proposals(
            batch(AttributeProposal("likes", "tea", ("e1",), 0.6)), observed_at=T0, now=T0
        )
        later = T0 + timedelta(days=gap)
        p.apply_proposals(
            batch(AttributeProposal("likes", "tea", ("e2",), 0.6)), observed_at=later, now=later
        )
    (f,), (s,) = fresh.attributes.values(), stale.attributes.values()
    assert f.confidence == pytest.approx(0.84)
    assert s.confidence < f.confidence
    assert f.evidence == ("e1", "e2")


@settings(max_examples=60, deadline=None)
@given(
    confidence=st.one_of(st.floats(min_value=-5, max_value=5), st.just(float("nan"))),
    explicit=st.booleans(),
    repeats=st.integers(min_value=1, max_value=4),
)
def test_items_without_evidence_are_inferred_and_capped(
    confidence: float, explicit: bool, repeats: int
) -> None:
    p = profile_with_consent()
    for _ in range(repeats):
        p.apply_proposals(
            batch(
                AttributeProposal("occupation", "pilot", (), confidence, explicit=explicit),
                MemoryProposal("a note", (), importance=confidence),
                IntentProposal("fly to Rome", (), confidence=confidence),
            ),
            observed_at=T0,
            now=T0,
        )
    for a in p.attributes.values():
        assert a.provenance == "inferred"
        assert 0.0 <= a.confidence <= INFERRED_CONFIDENCE_CAP
    for i in p.intents.values():
        assert i.confidence <= 1.0


def test_proposals_outside_consented_categories_are_dropped() -> None:
    p = profile_with_consent(categories=("conversation",))
    applied = p.apply_proposals(
        batch(AttributeProposal("home_location", "Paris", ("e1",)), MemoryProposal("hi", ("e1",))),
        observed_at=T0,
        now=T0,
    )
    assert applied == 1
    assert p.attributes == {}


def test_intent_lifecycle() -> None:
    p = profile_with_consent()
    p.apply_proposals(batch(IntentProposal("run a marathon", ("e1",))), observed_at=T0, now=T0)
    (intent_id,) = p.intents
    p.apply_proposals(
        batch(
            IntentUpdateProposal(
                IntentStatus.FULFILLED, description="run a marathon", evidence=("e2",)
            )
        ),
        observed_at=T0,
        now=T0,
    )
    assert p.intents == {}
    with pytest.raises(IntentTransitionError):
        p.change_intent_status(intent_id, IntentStatus.ABANDONED, observed_at=T0)


def test_an_intent_is_moved_only_by_an_app_consented_for_its_category() -> None:
    """I2: moving an intent uses its category, as proposing one does; an update from an
    app without that consent (or, matched by description, from any batch) is dropped."""
    p = profile_with_consent(categories=("goal",))
    p.apply_proposals(batch(IntentProposal("run a marathon", ("e1",))), observed_at=T0, now=T0)
    (intent_id,) = p.intents
    update = IntentUpdateProposal(IntentStatus.ABANDONED, intent_id=intent_id)
    other_app = replace(batch(update), app_id="app:other")
    assert p.apply_proposals(other_app, observed_at=T0, now=T0) == 0
    other_purpose = replace(batch(update), purpose="marketing")
    assert p.apply_proposals(other_purpose, observed_at=T0, now=T0) == 0
    assert list(p.intents) == [intent_id]
    assert p.apply_proposals(batch(update), observed_at=T0, now=T0) == 1
    assert p.intents == {}


def test_intents_expire_at_their_deadline() -> None:
    p = profile_with_consent()
    p.apply_proposals(
        batch(IntentProposal("renew passport", ("e1",), expires_at=T0 + timedelta(days=3))),
        observed_at=T0,
        now=T0,
    )
    assert p.expire_intents(T0 + timedelta(days=1)) == []
    assert len(p.expire_intents(T0 + timedelta(days=4))) == 1
    assert p.intents == {}


def test_erasing_a_capture_restates_attributes_with_other_evidence() -> None:
    p = profile_with_consent()
    for e in ("e1", "e2"):
        p.apply_proposals(batch(AttributeProposal("likes", "tea", (e,))), observed_at=T0, now=T0)
    p.apply_proposals(batch(AttributeProposal("likes", "jazz", ("e1",))), observed_at=T0, now=T0)
    p.collect_events()
    outcome = p.erase_capture("e1", cited_by=[], now=T0)
    assert outcome == {"items_erased": 1, "attributes_restated": 1}
    (tea,) = p.attributes.values()
    assert tea.value == "tea" and tea.evidence == ("e2",)
    assert event_names(p) == ["AttributeRestated", "ItemsErased", "CaptureErased"]


def test_erased_subject_refuses_every_command() -> None:
    p = profile_with_consent()
    p.erase(request_id="r", basis="test", now=T0)
    with pytest.raises(SubjectErasedError):
        p.capture(Interaction(app_id=APP, agent_id="a", occurred_at=T0, user_input="x"), now=T0)
    with pytest.raises(SubjectErasedError):
        p.grant_consent(
            app_id=APP, categories=("*",), purposes=("x",), legal_basis="c", granted_at=T0
        )


def _replayed(p: SubjectProfile) -> SubjectProfile:
    """The same subject rebuilt from its events alone."""
    events = p.collect_events()
    rebuilt: SubjectProfile | None = None
    for e in events:
        rebuilt = e.mutate(rebuilt)  # type: ignore[assignment]
    assert rebuilt is not None
    return rebuilt


def _busy_profile() -> SubjectProfile:
    p = profile_with_consent()
    p.apply_proposals(
        batch(
            AttributeProposal("home_location", "Paris", ("e1",)),
            AttributeProposal("home_location", "Lisbon", ("e2",)),
            AttributeProposal("diet", "vegetarian", ("e1",)),
            IntentProposal("book a flight to Rome", ("e2",), expires_at=T0 + timedelta(1)),
        ),
        observed_at=T0,
        now=T0,
    )
    p.apply_proposals(
        batch(AttributeProposal("diet", "vegetarian", ("e3",))),
        observed_at=T0 + timedelta(days=2),
        now=T0,
    )
    return p


def test_state_is_value_objects_and_replay_equals_live() -> None:
    from domain.profile import AttributeState, ConsentState, IntentState

    live = _busy_profile()
    assert all(isinstance(a, AttributeState) for a in live.attributes.values())
    assert all(isinstance(c, ConsentState) for c in live.consents.values())
    assert all(isinstance(i, IntentState) for i in live.intents.values())
    (diet,) = [a for a in live.attributes.values() if a.key == "diet"]
    assert diet.evidence == ("e1", "e3")
    replayed = _replayed(live)
    assert replayed.attributes == live.attributes
    assert replayed.consents == live.consents
    assert replayed.intents == live.intents


def test_a_snapshot_of_dict_state_upcasts_into_the_same_value_objects() -> None:
    """Snapshots taken before the state was typed (class_version 1, plain dicts) load."""
    import dataclasses

    live = _busy_profile()
    snapshot = SubjectProfile.Snapshot.take(live)
    assert snapshot.state["class_version"] == 4
    old_state = dict(snapshot.state)
    del old_state["class_version"]
    del old_state["archived_memories"]  # version 3
    del old_state["quarantined"]  # version 4
    for part in ("consents", "attributes", "intents"):
        old_state[part] = {
            k: {
                f: (list(v) if isinstance(v, tuple) else v)
                for f, v in dataclasses.asdict(o).items()
            }
            for k, o in snapshot.state[part].items()
        }
    old = SubjectProfile.Snapshot(  # type: ignore[call-arg]
        originator_id=snapshot.originator_id,
        originator_version=snapshot.originator_version,
        timestamp=snapshot.timestamp,
        topic=snapshot.topic,
        state=old_state,
    )
    loaded = old.mutate(None)
    assert isinstance(loaded, SubjectProfile)
    assert loaded.attributes == live.attributes
    assert loaded.consents == live.consents
    assert loaded.intents == live.intents


def test_a_memory_is_archived_once_and_erasure_forgets_it() -> None:
    """The aggregate keeps the archived memories' ids: archiving one again decides
    nothing (the decay job of another process, or its own retry, 2026-12-05)."""
    p = profile_with_consent()
    assert p.archive_memories(["m2", "m1", "m1"], reason="cold") == ["m1", "m2"]
    assert p.archive_memories(["m1", "m2"], reason="cold") == []
    assert p.archive_memories(["m2", "m3"], reason="cold") == ["m3"]
    p.erase_items(["m3"], reason="user")
    assert p.archived_memories == {"m1", "m2"}
    replayed = _replayed(p)
    assert replayed.archived_memories == {"m1", "m2"}
    replayed.erase(request_id="r", basis="user", now=datetime(2025, 2, 1, tzinfo=UTC))
    assert replayed.archived_memories == set()


def test_a_snapshot_taken_before_archives_were_kept_loads_with_none() -> None:
    """Version-2 snapshots lack ``archived_memories``: they load, with an empty set."""
    live = _busy_profile()
    live.archive_memories(["m1"], reason="cold")
    snapshot = SubjectProfile.Snapshot.take(live)
    assert snapshot.state["archived_memories"] == {"m1"}
    old_state = dict(snapshot.state)
    old_state["class_version"] = 2
    del old_state["archived_memories"]
    del old_state["quarantined"]  # version 4
    old = SubjectProfile.Snapshot(  # type: ignore[call-arg]
        originator_id=snapshot.originator_id,
        originator_version=snapshot.originator_version,
        timestamp=snapshot.timestamp,
        topic=snapshot.topic,
        state=old_state,
    )
    loaded = old.mutate(None)
    assert isinstance(loaded, SubjectProfile)
    assert loaded.archived_memories == set()
    assert loaded.attributes == live.attributes
    assert loaded.archive_memories(["m2"], reason="cold") == ["m2"]


def test_a_snapshot_taken_before_quarantine_loads_with_none_quarantined() -> None:
    """Version-3 snapshots lack ``quarantined`` (decision 0087): they load, with none."""
    live = _busy_profile()
    snapshot = SubjectProfile.Snapshot.take(live)
    old_state = dict(snapshot.state)
    old_state["class_version"] = 3
    del old_state["quarantined"]
    old = SubjectProfile.Snapshot(  # type: ignore[call-arg]
        originator_id=snapshot.originator_id,
        originator_version=snapshot.originator_version,
        timestamp=snapshot.timestamp,
        topic=snapshot.topic,
        state=old_state,
    )
    loaded = old.mutate(None)
    assert isinstance(loaded, SubjectProfile)
    assert loaded.quarantined == {}
    assert loaded.attributes == live.attributes


_texts = st.text(min_size=1, max_size=30).filter(lambda s: normalise_value(s) != "")


@given(
    value=_texts, description=_texts, text=_texts, fields=st.lists(_texts, min_size=4, max_size=4)
)
@settings(max_examples=60, deadline=None)
def test_a_proposals_identity_is_the_identity_of_the_event_it_records(
    value: str, description: str, text: str, fields: list[str]
) -> None:
    """What the erasure ledger fingerprints (the recording event's identity) is what the
    update engine asks about (the proposal's), whatever the spelling and spacing."""
    p = profile_with_consent()
    proposals = [
        AttributeProposal("home_location", value, ("c1",)),
        IntentProposal(description, ("c1",)),
        MemoryProposal(text, evidence=("c1",)),
        ExperienceProposal(*fields, evidence=("c1",)),
    ]
    for proposal in proposals:
        p.apply_proposals(batch(proposal), observed_at=T0, now=T0)
    recorded = [recorded_identity(e) for e in p.collect_events()]
    recorded = [r for r in recorded if r is not None]
    assert recorded == [proposal_identity(x) for x in proposals]


def test_a_proposal_an_erasure_took_is_dropped_and_others_are_not() -> None:
    p = profile_with_consent()
    asked: list[tuple[str, str, tuple[str, ...]]] = []

    def erased(kind: str, identity: str, evidence: tuple[str, ...]) -> bool:
        asked.append((kind, identity, evidence))
        return kind == "intent" and "c1" in evidence

    applied = p.apply_proposals(
        batch(
            IntentProposal("Learn to  sail!", ("c1",)),
            IntentProposal("learn to sail", ("c2",)),
            AttributeProposal("home_location", "Paris", ("c1",)),
            IntentProposal("learn to knit", ()),  # no evidence: nothing to ask
        ),
        observed_at=T0,
        now=T0,
        erased=erased,
    )
    assert applied == 3
    assert [a[:2] for a in asked] == [
        ("intent", "learn to sail"),
        ("intent", "learn to sail"),
        ("attribute", "home_location\x1fparis"),
    ]
    assert sorted(i.evidence for i in p.intents.values()) == [(), ("c2",)]
