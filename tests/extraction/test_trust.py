"""Extraction a user would trust (issue 16): several facts per sentence, negation and
change, hedges, "field: value" statements, and who said it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from domain.values import AttributeProposal, CapturedInteraction, IntentProposal
from tests.extraction.fake_openai import FakeOpenAI, chat_json
from tests.extraction.helpers import capture, summarise
from uprof.adapters.extraction import OpenAICompatibleExtractor, RuleBasedExtractor
from uprof.adapters.extraction.engine import REPORTED_CONFIDENCE
from uprof.adapters.extraction.speaker import SUBJECT_ACTOR, in_subject_voice, same_person

pytestmark = pytest.mark.allow_hosts(["127.0.0.1"])

RULES = RuleBasedExtractor()


def _attributes(c: CapturedInteraction) -> dict[str, AttributeProposal]:
    batch = RULES.extract(c)
    return {f"{p.key}={p.value}": p for p in batch.proposals if isinstance(p, AttributeProposal)}


def _by(actor: str, text: str, subject: str = "Caroline") -> CapturedInteraction:
    c = capture(text)
    return replace(
        c, interaction=replace(c.interaction, actor=actor, context=((SUBJECT_ACTOR, subject),))
    )


def test_vegetarian_and_allergic_gives_diet_and_allergy() -> None:
    assert summarise(RULES.extract(capture("I am vegetarian and allergic to peanuts"))) == {
        "diet=vegetarian",
        "allergy=peanuts",
    }


def test_porto_with_two_cats_gives_location_and_pet() -> None:
    assert summarise(RULES.extract(capture("I live in Porto with my two cats"))) == {
        "home_location=Porto",
        "pet=2 cats",
    }


def test_not_vegetarian_any_more_negates_the_diet() -> None:
    assert summarise(RULES.extract(capture("I'm not vegetarian any more"))) == {
        "diet=vegetarian!neg"
    }


@pytest.mark.parametrize(
    ("plain", "hedged"),
    [
        ("I'm allergic to peanuts", "I think I'm allergic to peanuts"),
        ("I'm vegan", "I'm vegan, I guess"),
        ("I live in Porto", "I probably live in Porto"),
    ],
)
def test_hedges_lower_confidence(plain: str, hedged: str) -> None:
    [sure] = _attributes(capture(plain)).values()
    [unsure] = _attributes(capture(hedged)).values()
    assert (sure.key, sure.value) == (unsure.key, unsure.value)
    assert unsure.confidence < sure.confidence


def test_a_hedge_stays_in_its_own_clause() -> None:
    found = _attributes(capture("I'm vegan and I think jazz is overrated"))
    assert found["diet=vegan"].confidence == 0.9


def test_field_value_statements_are_recognised() -> None:
    assert summarise(RULES.extract(capture("Name: Sam Lee; Age: 34; Hobbies: chess, hiking"))) == {
        "name=Sam Lee",
        "age=34",
        "likes=chess",
        "likes=hiking",
    }


def test_a_named_field_is_reported_unless_the_name_is_the_subject() -> None:
    [unknown] = _attributes(capture("Zhang Xiaohong's gender: female")).values()
    assert (unknown.key, unknown.value, unknown.reported) == ("gender", "female", True)
    assert unknown.confidence <= REPORTED_CONFIDENCE
    [own] = _attributes(
        _by("Zhang Xiaohong", "Zhang Xiaohong's gender: female", "Zhang Xiaohong")
    ).values()
    assert (own.key, own.value, own.reported) == ("gender", "female", False)
    assert own.confidence > REPORTED_CONFIDENCE


def test_another_speakers_own_statements_say_nothing_about_the_subject() -> None:
    batch = RULES.extract(
        _by("Melanie", "I'm a teacher. I live in Denver. I want to run a marathon.")
    )
    assert summarise(batch) == set()
    assert not [p for p in batch.proposals if isinstance(p, IntentProposal)]


def test_what_another_speaker_says_about_the_subject_is_reported() -> None:
    found = _attributes(
        _by("Melanie", "You're vegan, right. Caroline lives in Boston. I'm a nurse.")
    )
    assert set(found) == {"diet=vegan", "home_location=Boston"}
    assert all(p.reported and p.confidence <= REPORTED_CONFIDENCE for p in found.values())


def test_the_subject_speaking_under_their_name_is_explicit() -> None:
    [p] = _attributes(_by("Caroline", "I'm vegan.")).values()
    assert not p.reported and p.confidence == 0.9
    [p] = _attributes(_by("caroline smith", "I'm vegan.")).values()
    assert not p.reported


def test_voice_rewriting() -> None:
    assert (
        in_subject_voice("You're a nurse and I'm a cook", "Ann") == "I'm a nurse and they're a cook"
    )
    assert in_subject_voice("Ann's dog is called Rex", "Ann") == "my dog is called Rex"
    assert in_subject_voice("I love jazz", "Ann") is None
    assert same_person("Caroline", "caroline  smith") and not same_person("Carol", "Caroline")


def test_llm_attributes_from_another_speaker_are_reported(fake_llm: FakeOpenAI) -> None:
    fake_llm.script(
        chat_json(
            {
                "attributes": [{"key": "diet", "value": "vegan", "confidence": 0.9}],
                "intents": [{"description": "run a marathon", "confidence": 0.7}],
            }
        )
    )
    with OpenAICompatibleExtractor(fake_llm.base_url, "m", timeout_s=2.0) as llm:
        batch = llm.extract(_by("Melanie", "You're vegan, and I want to run a marathon."))
    [attribute] = [p for p in batch.proposals if isinstance(p, AttributeProposal)]
    assert attribute.reported and not attribute.explicit
    assert attribute.confidence <= REPORTED_CONFIDENCE
    assert not [p for p in batch.proposals if isinstance(p, IntentProposal)]
    prompt = fake_llm.requests[-1].body["messages"][1]["content"]
    assert "Melanie, who is NOT the user" in prompt and "The user is Caroline" in prompt


@pytest.mark.parametrize(
    ("sentence", "expected"),
    [
        ("I have three cats and two dogs.", {"pet=3 cats", "pet=2 dogs"}),
        ("I have a boy and a girl.", {"family=son", "family=daughter"}),
        ("I have a lot of pets, 6 dogs and 4 cats!", {"pet=6 dogs", "pet=4 cats"}),
        ("I collect comic books.", {"likes=collecting comic books"}),
        ("I am in college.", {"occupation=college student"}),
        ("I work for a video game company.", {"employer=video game company"}),
        ("I work in the business sector.", {"occupation=business sector"}),
        ("My husband died last year.", {"family=late husband"}),
        ("My dad was a doctor.", {"family=dad"}),
        ("I called my mom.", set()),
        ("I am a woman.", {"gender=female"}),
        ("I'm a girl scout leader.", set()),
        ("I live on a farm.", {"home_location=farm"}),
        ("I live in a house.", set()),
    ],
)
def test_what_a_careful_reader_records(sentence: str, expected: set[str]) -> None:
    assert summarise(RULES.extract(capture(sentence))) == expected


def test_another_speakers_questions_and_greetings_state_nothing() -> None:
    batch = RULES.extract(_by("Melanie", "Thanks, Caroline! What type of music do you play?"))
    assert summarise(batch) == set()
    batch = RULES.extract(_by("Melanie", "I hope I can hear you play the violin some day."))
    assert summarise(batch) == set()
