"""A table of English sentences and exactly what the rule-based extractor must propose.

Each row lists the complete set of non-memory proposals (see ``helpers.summarise``
for the notation); an empty set means the sentence must yield no fact at all.
The turn time is Wednesday 2025-03-12 15:00 UTC, so "tomorrow" lapses 2025-03-14.
"""

from __future__ import annotations

import pytest

from tests.extraction.helpers import capture, summarise
from uprof.adapters.extraction import RuleBasedExtractor

TABLE: list[tuple[str, set[str]]] = [
    # --- identity -------------------------------------------------------------------
    ("My name is Sam Lee and I live in Berlin.", {"name=Sam Lee", "home_location=Berlin"}),
    ("I'm Sam, nice to meet you!", {"name=Sam"}),
    ("Hello there! My name's Ana.", {"name=Ana"}),
    ("Call me Ishmael.", {"name=Ishmael"}),
    ("I'm tired", set()),
    ("I'm fine", set()),
    ("I'm Canadian", set()),
    ("I'm Going to the store", set()),
    ("I Am Very Tired Today", set()),
    ("My name is not important", set()),
    ("I'm 34 years old.", {"age=34"}),
    ("I'm 5 minutes away", set()),
    ("I'm 100% sure", set()),
    ("I just turned 40 last week", {"age=40!sup"}),
    ("I'm a 34-year-old teacher from Ohio", {"age=34", "occupation=teacher"}),
    # --- location -------------------------------------------------------------------
    (
        "I used to live in Paris but moved to Lisbon",
        {"home_location=Paris!neg", "home_location=Lisbon!sup"},
    ),
    (
        "I moved from Paris to Lisbon last year",
        {"home_location=Paris!neg", "home_location=Lisbon!sup"},
    ),
    ("I no longer live in Paris", {"home_location=Paris!neg"}),
    ("I live in St. Louis", {"home_location=St. Louis"}),
    ("I live in the Netherlands", {"home_location=Netherlands"}),
    (
        "I live in Rio de Janeiro with my husband",
        {"home_location=Rio de Janeiro", "family=husband"},
    ),
    # A common-noun place is still where the user lives (issue 16: was set()).
    ("I live in a small town", {"home_location=small town"}),
    ("I live in fear", set()),
    ("My sister lives in Paris", {"family=sister"}),
    (
        "I'm from Portland, Oregon and work at Google",
        {"origin=Portland, Oregon", "employer=Google"},
    ),
    ("I'm from the future", set()),
    ("i live in new york and i'm a teacher", {"home_location=New York", "occupation=teacher"}),
    ("I'm Dutch but I live in Spain", {"home_location=Spain"}),
    ("I grew up in Manchester", {"origin=Manchester"}),
    # --- occupation and employer ----------------------------------------------------
    ("I'm a software engineer at Google", {"occupation=software engineer", "employer=Google"}),
    ("I'm not a doctor", {"occupation=doctor!neg"}),
    ("my friend is a nurse", set()),
    # The mother's job is not the user's, but the user has a mother (issue 16: was set()).
    ("My mom is a nurse", {"family=mom"}),
    ("She thinks I'm a nurse", set()),
    ("I work as a barista at Blue Bottle", {"occupation=barista", "employer=Blue Bottle"}),
    ("I'm a good cook", set()),
    ("I'm a perfectionist", set()),
    ("I'm a morning person", {"routine=morning person"}),  # issue 16: was set()
    ("I'm the CEO of Acme Corp", {"occupation=CEO", "employer=Acme Corp"}),
    ("I'm a former teacher", {"occupation=teacher!neg"}),
    ("I used to be a lawyer", {"occupation=lawyer!neg"}),
    ("I'm a student at MIT", {"occupation=student"}),
    ("I work for myself", {"employer=self-employed"}),
    ("I work at a bank", {"employer=bank"}),  # a common-noun workplace (issue 16: was set())
    ("If I were a doctor I would help", set()),
    # --- language --------------------------------------------------------------------
    (
        "I speak English, Spanish and a bit of French",
        {"language=English", "language=Spanish", "language=French"},
    ),
    ("I'm learning Japanese", {"intent:learn Japanese"}),
    ("I don't speak French", {"language=French!neg"}),
    ("My native language is Portuguese", {"language=Portuguese"}),
    ("I speak to my mother every day", {"routine=speak to my mother every day"}),
    # --- likes and dislikes --------------------------------------------------------
    ("I love hiking, swimming and reading", {"likes=hiking", "likes=swimming", "likes=reading"}),
    ("I like rock and roll", {"likes=rock and roll"}),
    ("I don't like olives", {"dislikes=olives"}),
    ("I don't like sushi anymore", {"likes=sushi!neg"}),
    ("I hate it when people are late", set()),
    ("I can't stand cilantro", {"dislikes=cilantro"}),
    ("I like it", set()),
    ("I love you", set()),
    ("I like your idea", set()),
    ("What I like about Berlin is the food", set()),
    ("My favourite food is sushi", {"likes=favourite food: sushi"}),
    ("Pizza is my favorite food", {"likes=favourite food: pizza"}),
    ("I'm a big fan of Radiohead", {"likes=Radiohead"}),
    ("I'm not a fan of horror movies", {"dislikes=horror movies"}),
    ("My hobbies are painting and knitting", {"likes=painting", "likes=knitting"}),
    ("In my free time I go hiking", {"likes=hiking"}),
    # --- diet and health --------------------------------------------------------------
    ("I'm vegan", {"diet=vegan"}),
    ("I don't eat meat", {"diet=no meat"}),
    ("I'm no longer vegetarian", {"diet=vegetarian!neg"}),
    ("I went vegan last year", {"diet=vegan!sup"}),
    ("I'm allergic to peanuts and shellfish", {"allergy=peanuts", "allergy=shellfish"}),
    ("I'm not allergic to anything", set()),
    ("I'm lactose intolerant", {"allergy=lactose"}),
    # --- pets and family ----------------------------------------------------------------
    ("I have a dog named Rex", {"pet=dog named Rex"}),
    ("My cat Luna is sick", {"pet=cat named Luna"}),
    ("My friend's dog is called Max", set()),
    ("My dog died last week", {"pet=dog!neg"}),
    ("I have a cat allergy", {"allergy=cat"}),
    ("I have two kids", {"family=2 children"}),
    (
        "My son Tom is 5 and my daughter Mia is 3",
        {"family=son named Tom", "family=daughter named Mia"},
    ),
    ("I'm married with two kids", {"family=spouse", "family=2 children"}),
    ("I have no idea", set()),
    # --- routine and contact --------------------------------------------------------
    ("Every morning I go for a run", {"routine=go for a run every morning"}),
    # A pastime done regularly is also a taste (issue 16: the like was not proposed).
    (
        "I usually play tennis on Mondays",
        {"routine=play tennis on Mondays", "likes=playing tennis"},
    ),
    (
        "My email is Sam.Lee@Example.com and my number is +1 415 555 0123",
        {"email=sam.lee@example.com", "phone=+14155550123"},
    ),
    ("Please forward this to bob@example.com", set()),
    # --- intents and updates --------------------------------------------------------
    ("I want to run a marathon by June", {"intent:run a marathon@2025-07-01"}),
    ("I need to buy milk tomorrow", {"intent:buy milk@2025-03-14"}),
    ("I'm planning to visit Japan next year", {"intent:visit Japan@2027-01-01"}),
    ("I'm moving to Lisbon next month", {"intent:move to Lisbon@2025-05-01"}),
    ("My goal for this year is to read 50 books", {"intent:read 50 books@2026-01-01"}),
    ("I'm thinking about learning to code", {"intent:learn to code"}),
    ("I'd like to learn Italian someday", {"intent:learn Italian"}),
    ("I'm going to call my mom on Friday", {"intent:call my mom@2025-03-15"}),
    ("Hi Claude, I'm going to the gym tomorrow", set()),
    ("I'm going to be honest", set()),
    ("I want to know how to cook rice", set()),
    ("I don't want to go", set()),
    ("I finished reading Dune yesterday", {"fulfilled:read Dune"}),
    ("I've finally finished my thesis", {"fulfilled:my thesis"}),
    ("I gave up on learning the guitar", {"abandoned:learn the guitar"}),
    ("I no longer want to move to Canada", {"abandoned:move to Canada"}),
    ("I'm going to Paris next week", {"intent:go to Paris@2025-03-24"}),
    ("I'm trying to figure out what to cook tonight", set()),
    ("I want you to summarize this article", set()),
    # --- more realistic turns -----------------------------------------------------------
    ("I've lived in London all my life", {"home_location=London"}),
    ("I've lived in Paris before", set()),
    ("We live in Austin", set()),
    ("Honestly I hate running but I do it every day", {"dislikes=running"}),
    ("I usually wake up at 6am", {"routine=wake up at 6am"}),
    ("I go to the gym three times a week", {"routine=go to the gym three times a week"}),
    ("I'm Jordan, and I'm a nurse in Chicago", {"name=Jordan", "occupation=nurse"}),
    ("I'm 6 feet tall", set()),
    ("I was born in 1990", set()),
    ("You can reach me at 415-555-0123", {"phone=4155550123"}),
    ("I'm in a meeting right now", set()),
    ("I'm sorry, I didn't get that", set()),
    # --- small talk ---------------------------------------------------------------------
    ("ok", set()),
    ("thanks!", set()),
    ("Can you recommend a good book about history?", set()),
]


@pytest.fixture(scope="module")
def extractor() -> RuleBasedExtractor:
    return RuleBasedExtractor()


def test_table_is_large_enough() -> None:
    assert len(TABLE) >= 60
    assert sum(1 for _, expected in TABLE if not expected) >= 20  # plenty of negatives


@pytest.mark.parametrize(("sentence", "expected"), TABLE, ids=[s[:40] for s, _ in TABLE])
def test_sentence(extractor: RuleBasedExtractor, sentence: str, expected: set[str]) -> None:
    assert summarise(extractor.extract(capture(sentence))) == expected
