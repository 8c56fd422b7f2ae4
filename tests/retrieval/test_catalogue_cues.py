"""The ranker's category cue words come from the catalogue (domain.catalogue)."""

from __future__ import annotations

from domain.catalogue import CATALOGUE
from domain.values import ATTRIBUTE_KEYS
from tests.domain.test_catalogue import VEHICLE, before_catalogue
from uprof.retrieval.ranker import CATEGORY_CUES, analyse_query, category_cues
from uprof.retrieval.text import stem

#: The cue lexicon as the literal it was before the catalogue.
CUES_BEFORE = {
    "identity": "name names age old birthday born gender identity pronoun pronouns nationality",
    "location": "live lives living city country home move moved town address neighborhood "
    "located location hometown",
    "occupation": "job jobs work works working career occupation employer company profession "
    "office colleague boss business employed",
    "language": "language languages speak speaks english spanish french german chinese "
    "translate fluent",
    "preference": "like likes favorite favourite prefer prefers preference enjoy enjoys love "
    "hate dislike recommend recommendation suggest suggestion hobby hobbies taste style",
    "diet": "eat eats eating food foods meal meals diet vegetarian vegan cook cooking recipe "
    "restaurant dinner lunch breakfast snack drink drinks allergy allergic gluten",
    "pet": "pet pets dog dogs cat cats puppy kitten animal animals vet",
    "family": "family kid kids child children son daughter wife husband partner mother father "
    "mom dad sister brother parent parents grandma grandpa married",
    "schedule": "schedule routine morning evening weekend weekends calendar appointment "
    "meeting daily weekly",
    "goal": "goal goals plan plans planning want wants aim hope dream aspire intend",
    "health": "health healthy doctor allergy allergies medication medicine sick ill pain "
    "exercise sleep injury",
    "contact": "email phone contact call number reach",
}


def test_the_cue_sets_are_what_they_were_before_the_catalogue() -> None:
    """For the categories of then; a category added since adds its own."""
    old = {category: cues for category, cues in CATEGORY_CUES.items() if category in CUES_BEFORE}
    assert old == {
        category: frozenset(stem(w) for w in raw.split()) for category, raw in CUES_BEFORE.items()
    }
    assert list(old) == list(CUES_BEFORE)
    assert category_cues(before_catalogue()) == old


def test_every_category_owning_a_key_is_reached_by_a_question_naming_it() -> None:
    for spec in {spec.category for spec in ATTRIBUTE_KEYS.values()}:
        assert CATEGORY_CUES.get(spec), spec


def test_a_category_added_to_a_catalogue_reaches_the_cues() -> None:
    cues = category_cues(CATALOGUE.extended(VEHICLE))
    assert cues["trial_vehicle"] == frozenset(
        stem(w) for w in "car cars drive driving vehicle".split()
    )
    assert {k: v for k, v in cues.items() if k != "trial_vehicle"} == CATEGORY_CUES
    assert "trial_vehicle" not in analyse_query("which car do I drive").categories
