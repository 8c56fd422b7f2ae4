"""Memories carry the categories of what they reveal (decision 0016), in the domain alone."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
from eventsourcing.application import Application
from eventsourcing.persistence import Mapper, StoredEvent

from domain.categories import (
    DETECTED_CATEGORIES,
    PATTERNS,
    detect_categories,
    memory_categories,
)
from domain.errors import InvalidInputError
from domain.lexicon import FAMILY_RELATIONS, NAMED_ONLY_RELATIONS
from domain.profile import SubjectProfile
from domain.values import (
    CATEGORIES,
    AttributeProposal,
    ExperienceProposal,
    IntentProposal,
    MemoryProposal,
    ProposalBatch,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
APP = "app:planner"

#: (text, categories the detector must find). Each sensitive category, several ways.
DETECTED = [
    ("I was diagnosed with diabetes last spring", {"health"}),
    ("My therapist says the new medication helps", {"health"}),
    ("I'm allergic to shellfish", {"health"}),
    ("Back from the hospital after surgery", {"health"}),
    ("I live in Lisbon and I want to run a half marathon", {"location"}),
    ("We moved to Berlin in 2019", {"location"}),
    ("I'm originally from Porto", {"location"}),
    ("Our address is 12 Rua Augusta Street", {"location"}),
    ("My wife and I went hiking", {"family"}),
    ("My little brother turns ten tomorrow", {"family"}),
    ("We got divorced last year", {"family"}),
    ("My salary barely covers the mortgage", {"finance"}),
    ("I owe the bank $12,000", {"finance"}),
    ("I invested in bitcoin", {"finance"}),
    ("My name is Ana Sousa", {"identity"}),
    ("I'm 34 years old", {"identity"}),
    ("I'm Catholic and go to church on Sundays", {"identity"}),
    ("My passport expires in May", {"identity"}),
    ("I came out as gay to my friends", {"identity"}),
    ("Write to me at ana@example.com", {"contact"}),
    ("Call me on +351 912 345 678", {"contact"}),
    ("My instagram is @ana.runs", {"contact"}),
]

#: Ordinary turns the detector must leave alone: it must not tag everything.
NOT_DETECTED = [
    "I love pizza and jazz",
    "We watched a movie together",
    "I'm going to the gym tomorrow",
    "I painted a sunrise last week",
    "The years 2019-2023 were a blur",
    "I ran a race on 2023-05-08 and felt great",
    "Can you call me tomorrow please",
    "What a great book, thanks for the tip",
    "I prefer short answers",
    "Let's plan the sprint for next week",
]


@pytest.mark.parametrize(("text", "expected"), DETECTED)
def test_detector_finds_the_sensitive_category(text: str, expected: set[str]) -> None:
    assert expected <= detect_categories(text)


@pytest.mark.parametrize("text", NOT_DETECTED)
def test_detector_leaves_ordinary_turns_alone(text: str) -> None:
    assert detect_categories(text) == frozenset()


def test_every_detected_category_is_in_the_catalogue_and_has_a_case() -> None:
    """Cases here for the categories with patterns; every category's catalogue cues are
    tried one by one in tests/domain/test_catalogue.py, so a new one is covered there."""
    assert set(DETECTED_CATEGORIES) <= set(CATEGORIES)
    covered = set().union(*(expected for _, expected in DETECTED))
    assert covered <= set(DETECTED_CATEGORIES)
    assert set(PATTERNS) <= covered


@pytest.mark.parametrize("relation", sorted(FAMILY_RELATIONS | NAMED_ONLY_RELATIONS))
def test_detector_knows_every_family_relation_of_the_extraction_lexicon(relation: str) -> None:
    assert "family" in detect_categories(f"I had lunch with my {relation} today")


def test_memory_categories_put_the_primary_first_and_add_detection() -> None:
    got = memory_categories("conversation", revealed=["goal"], texts=["I live in Lisbon"])
    assert got == ["conversation", "goal", "location"]


# ------------------------------------------------------------------ the aggregate


def profile(categories: tuple[str, ...] = ("*",)) -> SubjectProfile:
    p = SubjectProfile(id=uuid.uuid4(), tenant="t")
    p.grant_consent(
        app_id=APP,
        categories=categories,
        purposes=("personalization",),
        legal_basis="consent",
        granted_at=T0,
    )
    p.collect_events()
    return p


def batch(*proposals: object) -> ProposalBatch:
    return ProposalBatch(tuple(proposals), author="test", owner_agent="agent:a", app_id=APP)  # type: ignore[arg-type]


def recorded(p: SubjectProfile) -> list[object]:
    return [
        e
        for e in p.collect_events()
        if isinstance(e, SubjectProfile.MemoryRecorded | SubjectProfile.ExperienceRecorded)
    ]


def test_memory_carries_the_categories_of_its_captures_attributes_and_intents() -> None:
    p = profile()
    ev = ("c1",)
    p.apply_proposals(
        batch(
            MemoryProposal("Lisboa is home; half marathon next", ev),
            AttributeProposal("home_location", "Lisboa", ev),
            IntentProposal("run a half marathon", ev),
        ),
        observed_at=T0,
        now=T0,
    )
    (memory,) = recorded(p)
    assert memory.categories == ["conversation", "goal", "location"]  # type: ignore[attr-defined]


def test_an_attribute_dropped_for_want_of_consent_still_tags_the_memory() -> None:
    p = profile(("conversation",))
    ev = ("c1",)
    applied = p.apply_proposals(
        batch(AttributeProposal("diet", "vegan", ev), MemoryProposal("Vegan since May", ev)),
        observed_at=T0,
        now=T0,
    )
    assert applied == 1  # the memory only: no diet consent
    (memory,) = recorded(p)
    assert "diet" in memory.categories  # type: ignore[attr-defined]


def test_an_attribute_from_an_earlier_batch_tags_a_later_memory_of_the_same_capture() -> None:
    p = profile()
    ev = ("c1",)
    p.apply_proposals(batch(AttributeProposal("pet", "cat", ev)), observed_at=T0, now=T0)
    p.collect_events()
    p.apply_proposals(batch(MemoryProposal("Mimi sleeps all day", ev)), observed_at=T0, now=T0)
    (memory,) = recorded(p)
    assert "pet" in memory.categories  # type: ignore[attr-defined]


def test_a_proposer_cannot_launder_a_sensitive_memory_as_conversation() -> None:
    p = profile()
    p.apply_proposals(
        batch(MemoryProposal("I was diagnosed with cancer", category="conversation")),
        observed_at=T0,
        now=T0,
    )
    (memory,) = recorded(p)
    assert memory.category == "conversation"  # type: ignore[attr-defined]
    assert "health" in memory.categories  # type: ignore[attr-defined]


def test_a_proposers_extra_categories_are_kept_and_checked() -> None:
    p = profile()
    p.apply_proposals(
        batch(MemoryProposal("Prefers window seats", categories=("preference",))),
        observed_at=T0,
        now=T0,
    )
    (memory,) = recorded(p)
    assert memory.categories == ["conversation", "preference"]  # type: ignore[attr-defined]
    with pytest.raises(InvalidInputError, match="unknown category"):
        p.apply_proposals(
            batch(MemoryProposal("x", categories=("gossip",))), observed_at=T0, now=T0
        )


def test_an_experience_carries_its_category_plus_detection() -> None:
    p = profile()
    p.apply_proposals(
        batch(
            ExperienceProposal(
                situation="user mentioned their chemo schedule",
                action="moved the meeting",
                outcome="user thanked",
                insight="avoid Monday mornings",
            )
        ),
        observed_at=T0,
        now=T0,
    )
    (experience,) = recorded(p)
    assert experience.categories == ["experience", "health"]  # type: ignore[attr-defined]


# ------------------------------------------------------------------ old events


def _mapper() -> Mapper:
    """A plain mapper with the transcoder the profiles application uses."""
    return Mapper(transcoder=Application().construct_transcoder())


def _stored_as_version_1(event: object) -> StoredEvent:
    """The event as a build from before decision 0016 would have stored it."""
    mapper = _mapper()
    stored = mapper.to_stored_event(event)
    state = json.loads(stored.state)
    # Memories are at version 3 (decision 0020 added ``span``), experiences at 2.
    assert state.pop("class_version") in (2, 3)
    state.pop("categories")
    state.pop("span", None)
    return StoredEvent(
        originator_id=stored.originator_id,
        originator_version=stored.originator_version,
        topic=stored.topic,
        state=json.dumps(state).encode(),
    )


def test_old_memory_events_load_with_their_primary_category() -> None:
    p = profile()
    p.apply_proposals(batch(MemoryProposal("I live in Lisbon")), observed_at=T0, now=T0)
    (memory,) = recorded(p)
    old = _stored_as_version_1(memory)
    assert b"categories" not in old.state
    loaded = _mapper().to_domain_event(old)
    assert loaded.categories == ["conversation"]
    assert loaded.text == "I live in Lisbon"
    assert loaded.span == []  # upcast through version 2 to 3: no span known


def test_old_experience_events_load_as_experience() -> None:
    p = profile()
    p.apply_proposals(
        batch(ExperienceProposal(situation="s", action="a", outcome="", insight="")),
        observed_at=T0,
        now=T0,
    )
    (experience,) = recorded(p)
    loaded = _mapper().to_domain_event(_stored_as_version_1(experience))
    assert loaded.categories == ["experience"]
