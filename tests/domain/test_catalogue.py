"""The category catalogue (domain.catalogue) and what the domain derives from it.

The derived structures must equal what they were before the catalogue existed (they are
observable: schemas, error messages, the policy hierarchy), and a category added to a
catalogue must reach every one of them. The pins hold for the categories and keys that
existed then (``before_catalogue``), so adding a category needs no edit here. The LLM
prompt and the ranker's cues, derived in uprof, are pinned in tests/extraction and
tests/retrieval.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from domain.catalogue import (
    CATALOGUE,
    AttributeKey,
    AttributeKeySpec,
    Catalogue,
    CategorySpec,
    Example,
)
from domain.categories import DETECTED_CATEGORIES, CategoryDetector, _cues, detect_categories
from domain.values import ATTRIBUTE_KEYS, CATEGORIES

#: CATEGORIES as the literal tuple it was before the catalogue (its order is observable).
CATEGORIES_BEFORE = (
    "identity",
    "location",
    "occupation",
    "language",
    "preference",
    "diet",
    "pet",
    "family",
    "schedule",
    "goal",
    "health",
    "contact",
    "conversation",
    "experience",
    "finance",
)
#: ATTRIBUTE_KEYS as the literal it was, in its order: (key, category, single-valued).
KEYS_BEFORE = [
    ("name", "identity", True),
    ("age", "identity", True),
    ("gender", "identity", True),
    ("home_location", "location", True),
    ("origin", "location", True),
    ("occupation", "occupation", True),
    ("employer", "occupation", True),
    ("language", "language", False),
    ("likes", "preference", False),
    ("dislikes", "preference", False),
    ("diet", "diet", True),
    ("allergy", "health", False),
    ("pet", "pet", False),
    ("family", "family", False),
    ("routine", "schedule", False),
    ("email", "contact", True),
    ("phone", "contact", True),
]

#: A category only tests know (named so that a real ``vehicle`` cannot collide with it).
VEHICLE = CategorySpec(
    "trial_vehicle",
    keys=(
        AttributeKey(
            "trial_car",
            single_valued=False,
            description="a car the user owns, e.g. 'red Fiat 500'",
            example=Example("I drive a red Fiat 500", "red Fiat 500"),
        ),
    ),
    retrieval_cues="car cars drive driving vehicle",
    detector_cues="licence plate, number plate, registration number",
)


def before_catalogue() -> Catalogue:
    """CATALOGUE restricted to the categories and keys that existed before it."""
    old_keys = {key for key, _, _ in KEYS_BEFORE}
    return Catalogue(
        tuple(
            replace(spec, keys=tuple(k for k in spec.keys if k.name in old_keys))
            for spec in CATALOGUE.specs
            if spec.name in CATEGORIES_BEFORE
        ),
        tuple(k for k in CATALOGUE.key_order if k in old_keys),
    )


def test_categories_and_keys_are_what_they_were_before_the_catalogue() -> None:
    old = before_catalogue()
    assert old.categories == CATEGORIES_BEFORE
    keys = old.attribute_keys()
    assert [(k, s.category, s.single_valued) for k, s in keys.items()] == KEYS_BEFORE
    # What the catalogue has since gained keeps these in their order.
    assert tuple(c for c in CATEGORIES if c in CATEGORIES_BEFORE) == CATEGORIES_BEFORE
    assert [(k, ATTRIBUTE_KEYS[k]) for k in ATTRIBUTE_KEYS if k in keys] == list(keys.items())


def test_detected_categories_are_the_sensitive_ones_they_were() -> None:
    assert set(CategoryDetector(before_catalogue()).categories) == {
        "health",
        "location",
        "family",
        "finance",
        "identity",
        "contact",
    }
    assert DETECTED_CATEGORIES == tuple(c for c in CATEGORIES if c in DETECTED_CATEGORIES)


def test_every_key_belongs_to_a_catalogue_category_and_has_a_description() -> None:
    for key, category in CATALOGUE.keys():
        assert category in CATEGORIES
        assert ATTRIBUTE_KEYS[key.name] == AttributeKeySpec(category, key.single_valued)
        assert key.description.strip()


def test_every_category_owning_keys_has_retrieval_cues() -> None:
    for spec in CATALOGUE.specs:
        if spec.keys:
            assert spec.retrieval_cues.split(), spec.name


@pytest.mark.parametrize("category", DETECTED_CATEGORIES)
def test_every_detector_cue_reveals_its_category(category: str) -> None:
    words, phrases = _cues(CATALOGUE.spec(category).detector_cues)
    cues = sorted(words) + [p.strip() for p in phrases]
    assert cues
    missed = [cue for cue in cues if category not in detect_categories(f"So, {cue} again.")]
    assert not missed


def test_a_category_added_to_a_catalogue_reaches_every_derived_structure() -> None:
    extended = CATALOGUE.extended(VEHICLE)
    assert extended.categories == (*CATEGORIES, "trial_vehicle")
    keys = extended.attribute_keys()
    assert list(keys) == [*ATTRIBUTE_KEYS, "trial_car"]
    assert keys["trial_car"] == AttributeKeySpec("trial_vehicle", False)
    detector = CategoryDetector(extended)
    assert detector.categories == (*DETECTED_CATEGORIES, "trial_vehicle")
    assert "trial_vehicle" in detector("The licence plate was muddy")
    assert detector("I live in Lisbon") == {"location"}
    # The default catalogue and its derived structures are untouched.
    assert "trial_vehicle" not in CATEGORIES and "trial_car" not in ATTRIBUTE_KEYS
    assert "trial_vehicle" not in detect_categories("The licence plate was muddy")


def test_a_category_without_detector_cues_is_not_detected() -> None:
    plain = CategorySpec("trial_vehicle", retrieval_cues="car")
    assert not plain.sensitive
    assert CategoryDetector(CATALOGUE.extended(plain)).categories == DETECTED_CATEGORIES


def key(name: str, description: str = "a thing") -> AttributeKey:
    return AttributeKey(name, single_valued=True, description=description)


@pytest.mark.parametrize(
    ("specs", "key_order", "message"),
    [
        ((CategorySpec("Vehicle"),), (), "category 'Vehicle': name must be"),
        ((CategorySpec("a"), CategorySpec("a")), (), "category 'a': name is already"),
        ((CategorySpec("any"),), (), "category 'any': name 'any' is the policy's root"),
        ((CategorySpec("a", keys=(key("Car"),)),), (), "key name 'Car' must be"),
        (
            (CategorySpec("a", keys=(key("car"),)), CategorySpec("b", keys=(key("car"),))),
            (),
            "category 'b': key 'car' already belongs to 'a'",
        ),
        ((CategorySpec("a", keys=(key("car", " "),)),), (), "key 'car': description must"),
        ((CategorySpec("a", keys=(key("car", "x\ny"),)),), (), "key 'car': description must"),
        (
            (
                CategorySpec(
                    "a",
                    keys=(AttributeKey("car", True, "a car", Example("", "Fiat")),),
                ),
            ),
            (),
            "key 'car': example needs a sentence and a value",
        ),
        ((CategorySpec("a", keys=(key("car"),)),), ("bike",), "key_order: bike not a key"),
        ((CategorySpec("a", keys=(key("car"),)),), ("car", "car"), "key_order: a key is listed"),
    ],
)
def test_a_malformed_catalogue_is_refused_naming_the_field(
    specs: tuple[CategorySpec, ...], key_order: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Catalogue(specs, key_order)


def test_detector_patterns_must_name_a_detected_category() -> None:
    with pytest.raises(ValueError, match="patterns: pet not a category with detector_cues"):
        CategoryDetector(CATALOGUE, {"pet": lambda text: True})
