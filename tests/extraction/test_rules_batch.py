"""The batch the rule-based extractor returns: fields, evidence, memory, de-duplication."""

from __future__ import annotations

import pytest

from domain.values import (
    AttributeProposal,
    CapturedInteraction,
    Interaction,
    MemoryProposal,
    ProposalBatch,
)
from tests.extraction.helpers import TURN_TIME, capture, memories, summarise
from uprof.adapters.extraction import RuleBasedExtractor
from uprof.adapters.extraction.rules import importance, is_small_talk, strip_greeting, truncate
from uprof.ports import Extractor


@pytest.fixture(scope="module")
def extractor() -> RuleBasedExtractor:
    return RuleBasedExtractor()


def test_satisfies_the_extractor_port(extractor: RuleBasedExtractor) -> None:
    port: Extractor = extractor
    assert port.name == "rules"


def test_batch_fields_come_from_the_interaction(extractor: RuleBasedExtractor) -> None:
    batch = extractor.extract(capture("I live in Berlin", capture_id="cap-42"))
    assert isinstance(batch, ProposalBatch)
    assert batch.author == "rules/v1"
    assert batch.owner_agent == "agent-1"
    assert batch.sharing == "shared:coach"
    assert batch.app_id == "app-1"
    assert batch.purpose == "personalization"


def test_every_proposal_cites_the_capture_and_is_explicit(extractor: RuleBasedExtractor) -> None:
    text = (
        "Hi! My name is Sam, I'm a nurse and I live in Leeds. I love jazz. "
        "I want to run a marathon by June. I finished my thesis."
    )
    batch = extractor.extract(capture(text, capture_id="cap-xyz"))
    assert len(batch.proposals) >= 6
    for p in batch.proposals:
        assert p.evidence == ("cap-xyz",)
    attributes = [p for p in batch.proposals if isinstance(p, AttributeProposal)]
    assert attributes and all(a.explicit for a in attributes)


def test_agent_response_is_never_evidence_of_a_user_trait(extractor: RuleBasedExtractor) -> None:
    batch = extractor.extract(
        capture(
            "What do you think?",
            agent_response="My name is Bob, I'm a doctor, I live in Paris and I love jazz.",
        )
    )
    assert summarise(batch) == set()
    assert all("Bob" not in m.text for m in memories(batch))


def test_empty_input_proposes_nothing(extractor: RuleBasedExtractor) -> None:
    assert extractor.extract(capture("")).proposals == ()
    assert extractor.extract(capture("   \n ")).proposals == ()


def test_memory_keeps_the_users_words_without_the_greeting(extractor: RuleBasedExtractor) -> None:
    text = "Hi there!   I just got back from a trip to Rome and I loved it."
    batch = extractor.extract(capture(text, source_ref="turn-7"))
    [memory] = memories(batch)
    assert memory.text == "I just got back from a trip to Rome and I loved it."
    assert memory.category == "conversation"
    assert memory.source_refs == ("turn-7",)
    assert memory.occurred_at == TURN_TIME
    assert memory.evidence == ("cap-0001",)


def test_memory_without_source_ref_has_no_source_refs(extractor: RuleBasedExtractor) -> None:
    [memory] = memories(extractor.extract(capture("I had a long day at work")))
    assert memory.source_refs == ()


@pytest.mark.parametrize(
    "text",
    ["ok", "thanks!", "hi", "Hello!", "thank you so much", "Okay, sounds good.", "👍", "..."],
)
def test_no_memory_for_greetings_and_acknowledgements(
    extractor: RuleBasedExtractor, text: str
) -> None:
    assert memories(extractor.extract(capture(text))) == []


def test_facts_and_feelings_make_a_memory_more_important(extractor: RuleBasedExtractor) -> None:
    def importance_of(text: str) -> float:
        [memory] = memories(extractor.extract(capture(text)))
        return memory.importance

    small_talk = importance_of("What time is it?")
    fact = importance_of("I live in Berlin")
    fact_and_feeling = importance_of("I'm so stressed, my dog died last week")
    assert small_talk < fact < fact_and_feeling
    assert all(0.0 <= x <= 1.0 for x in (small_talk, fact, fact_and_feeling))


def test_long_turns_become_windows_of_whole_sentences(extractor: RuleBasedExtractor) -> None:
    """Nothing of a long turn is cut away (decision 0020): each window ends at a sentence
    end, stays within the memory length, cites the capture, and says where it came from."""
    sentence = "I spent the whole afternoon repainting the garden fence with my neighbour. "
    text = sentence * 20
    windows = memories(extractor.extract(capture(text)))
    assert len(windows) > 1
    for memory in windows:
        assert len(memory.text) <= 600 and memory.text.endswith(".")
        assert memory.evidence == ("cap-0001",)
        start, end = memory.span
        assert text[start:end] == memory.text
    assert sum(m.text.count("repainting") for m in windows) == 20  # every sentence kept


def test_truncate_marks_a_cut_inside_a_word_run() -> None:
    text = "word " * 100
    cut = truncate(text.strip(), 60)
    assert len(cut) <= 60 and cut.endswith("\u2026")
    assert text.startswith(cut[:-1])


def test_confidence_reflects_pattern_strength(extractor: RuleBasedExtractor) -> None:
    strong = extractor.extract(capture("My name is Sam"))
    weak = extractor.extract(capture("I'm Sam"))
    [s] = [p for p in strong.proposals if isinstance(p, AttributeProposal)]
    [w] = [p for p in weak.proposals if isinstance(p, AttributeProposal)]
    assert s.confidence > w.confidence


def test_the_same_fact_twice_is_proposed_once(extractor: RuleBasedExtractor) -> None:
    batch = extractor.extract(capture("I love jazz. I really love jazz! I'm a big fan of jazz."))
    likes = [p for p in batch.proposals if isinstance(p, AttributeProposal) and p.key == "likes"]
    assert [p.value for p in likes] == ["jazz"]
    assert likes[0].confidence == 0.8  # the strongest of the three cues


def test_lowercase_typist_gets_no_weak_name(extractor: RuleBasedExtractor) -> None:
    # "i'm sam" could be "i'm sad": without capitals only "my name is" names a user.
    assert summarise(extractor.extract(capture("i'm sam"))) == set()
    assert summarise(extractor.extract(capture("my name is sam"))) == {"name=Sam"}


def test_title_case_text_gets_no_weak_name(extractor: RuleBasedExtractor) -> None:
    assert summarise(extractor.extract(capture("Hey! I'm Thrilled To Be Here Today"))) == set()


def test_naive_turn_time_is_accepted(extractor: RuleBasedExtractor) -> None:
    naive = TURN_TIME.replace(tzinfo=None)
    batch = extractor.extract(capture("I need to buy milk tomorrow", occurred_at=naive))
    assert summarise(batch) == {"intent:buy milk@2025-03-14"}


def test_memory_max_chars_is_validated() -> None:
    with pytest.raises(ValueError):
        RuleBasedExtractor(memory_max_chars=10)


def test_custom_author_and_memory_length() -> None:
    extractor = RuleBasedExtractor(author="rules/test", memory_max_chars=40)
    batch = extractor.extract(
        capture("I went to the market and bought apples, pears and plums today.")
    )
    assert batch.author == "rules/test"
    windows = memories(batch)
    assert len(windows) == 2 and all(len(m.text) <= 40 for m in windows)
    assert " ".join(m.text for m in windows) == (
        "I went to the market and bought apples, pears and plums today."
    )


def test_helpers() -> None:
    assert strip_greeting("Hey Sam, how are you?") == "how are you?"
    assert strip_greeting("Hi I live in Rome") == "I live in Rome"
    assert strip_greeting("Hippos are big") == "Hippos are big"
    assert is_small_talk("ok thanks!!") and not is_small_talk("ok, I moved to Rome")
    assert importance("I live in Rome", found_facts=True) > importance("hm, why", found_facts=False)


def test_capture_without_optional_fields(extractor: RuleBasedExtractor) -> None:
    bare = CapturedInteraction(
        "c1", Interaction(app_id="a", agent_id="g", occurred_at=TURN_TIME, user_input="I'm vegan")
    )
    batch = extractor.extract(bare)
    assert summarise(batch) == {"diet=vegan"}
    assert batch.sharing == "private"
    assert all(isinstance(p, AttributeProposal | MemoryProposal) for p in batch.proposals)
