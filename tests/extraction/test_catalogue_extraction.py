"""What extraction derives from the category catalogue (domain.catalogue).

The LLM prompt's attribute lines come from the keys' descriptions and must stay
byte-identical to the prompt before the catalogue; each key's catalogue example is a
sentence the rule extractor must read that key from, so a key added to the catalogue
without rule patterns fails here.
"""

from __future__ import annotations

import hashlib

import pytest

from domain.catalogue import CATALOGUE, AttributeKey, Example
from domain.values import ATTRIBUTE_KEYS, CATEGORIES, AttributeProposal
from tests.domain.test_catalogue import VEHICLE, before_catalogue
from tests.extraction.helpers import capture
from tests.extraction.test_rules_table import TABLE
from uprof.adapters.extraction import SYSTEM_PROMPT, RuleBasedExtractor
from uprof.adapters.extraction.llm import system_prompt

#: sha256 of SYSTEM_PROMPT as the literal it was before the catalogue (commit 1546495).
PROMPT_SHA256_BEFORE = "76a36daaf6996cbd114fd6dffb88a5051235a309ee701a88aca8e40e03b31cd6"
EXTRACTOR = RuleBasedExtractor()
EXAMPLES = [(key, key.example) for key, _ in CATALOGUE.keys() if key.example is not None]


def test_the_prompt_is_byte_identical_to_the_one_before_the_catalogue() -> None:
    """For the categories and keys of then; a category added since adds its own lines."""
    prompt = system_prompt(before_catalogue())
    assert hashlib.sha256(prompt.encode()).hexdigest() == PROMPT_SHA256_BEFORE
    if CATALOGUE == before_catalogue():
        assert prompt == SYSTEM_PROMPT


def test_the_prompt_lists_every_key_with_its_description_and_every_category() -> None:
    lines = SYSTEM_PROMPT.splitlines()
    for key, _ in CATALOGUE.keys():
        assert f"- {key.name}: {key.description}" in lines
    assert f"category is one of: {', '.join(CATEGORIES)};" in SYSTEM_PROMPT


def test_a_category_added_to_a_catalogue_reaches_the_prompt() -> None:
    prompt = system_prompt(CATALOGUE.extended(VEHICLE))
    assert "- trial_car: a car the user owns, e.g. 'red Fiat 500'" in prompt.splitlines()
    assert f"category is one of: {', '.join(CATEGORIES)}, trial_vehicle;" in prompt
    assert "trial_vehicle" not in SYSTEM_PROMPT


def _read(sentence: str) -> set[tuple[str, str]]:
    batch = EXTRACTOR.extract(capture(sentence))
    return {(p.key, p.value) for p in batch.proposals if isinstance(p, AttributeProposal)}


@pytest.mark.parametrize(("key", "example"), EXAMPLES, ids=[k.name for k, _ in EXAMPLES])
def test_the_rules_read_every_key_from_its_catalogue_example(
    key: AttributeKey, example: Example
) -> None:
    assert (key.name, example.value) in _read(example.sentence)


def test_a_key_without_an_example_is_never_read_by_the_rules() -> None:
    """A key with no example claims no rule reads it; the rules table must agree."""
    unread = {key.name for key, _ in CATALOGUE.keys() if key.example is None}
    sentences = [sentence for sentence, _ in TABLE] + [e.sentence for _, e in EXAMPLES]
    read = {k for sentence in sentences for k, _ in _read(sentence)}
    assert read <= set(ATTRIBUTE_KEYS)
    assert not (unread & read)
