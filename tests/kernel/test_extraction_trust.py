"""Issue 16 through the kernel, on both backends: the rule extractor's negation,
several facts per sentence, and reported statements as stored profile items."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from policies import CasbinAuthorizer
from policies.rules import PolicyRule
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, consent, say, settings_for
from uprof.adapters.embeddings import HashingEmbedder
from uprof.adapters.extraction import RuleBasedExtractor
from uprof.adapters.extraction.speaker import SUBJECT_ACTOR
from uprof.bootstrap import bootstrap
from uprof.kernel import Uprof


def _capture_everything() -> CasbinAuthorizer:
    """The seed policy, plus: the test app may capture and read every category (what is
    tested here is extraction; which categories an app may capture is tested elsewhere)."""
    authorizer = CasbinAuthorizer.seeded()
    for action in ("read", "capture"):
        authorizer.add_rule(PolicyRule(APP, "default", action, "any", "personalization"))
    return authorizer


@pytest.fixture
def kernel(backend: Backend) -> Iterator[Uprof]:
    k = bootstrap(
        settings_for(backend),
        clock=FakeClock(),
        embedder=HashingEmbedder(),
        extractor=RuleBasedExtractor(),
        authorizer=_capture_everything(),
    )
    try:
        yield k
    finally:
        k.close()


def _current(kernel: Uprof, subject: str = "alice") -> dict[tuple[str, str], object]:
    return {
        (a.key, a.value): a for a in kernel.profile(subject).attributes if a.status != "superseded"
    }


def test_not_vegetarian_any_more_retracts_the_diet(kernel: Uprof) -> None:
    consent(kernel)
    kernel.capture_many("alice", [say("I am vegetarian", day=1)])
    assert ("diet", "vegetarian") in _current(kernel)
    kernel.capture_many("alice", [say("I'm not vegetarian any more", day=2)])
    assert ("diet", "vegetarian") not in _current(kernel)
    [old] = [a for a in kernel.profile("alice").attributes if a.key == "diet"]
    assert old.status == "superseded"


def test_moving_supersedes_the_old_home(kernel: Uprof) -> None:
    consent(kernel)
    kernel.capture_many("alice", [say("I live in Paris", day=1), say("I moved to Lisbon", day=2)])
    assert ("home_location", "Lisbon") in _current(kernel)
    assert ("home_location", "Paris") not in _current(kernel)


def test_one_sentence_with_several_facts_gives_several_attributes(kernel: Uprof) -> None:
    consent(kernel)
    kernel.capture_many(
        "alice",
        [say("I am vegetarian and allergic to peanuts"), say("I live in Porto with my two cats")],
    )
    assert set(_current(kernel)) == {
        ("diet", "vegetarian"),
        ("allergy", "peanuts"),
        ("home_location", "Porto"),
        ("pet", "2 cats"),
    }


def test_another_speakers_words_are_stored_as_reported(kernel: Uprof) -> None:
    consent(kernel, subject="caroline")
    turn = say("You're vegan, I know. I'm a nurse and I live in Denver.")
    turn = replace(turn, actor="Melanie", context=((SUBJECT_ACTOR, "Caroline"),))
    kernel.capture_many(
        "caroline",
        [
            turn,
            replace(
                say("I live in Boston"), actor="Caroline", context=((SUBJECT_ACTOR, "Caroline"),)
            ),
        ],
    )
    found = _current(kernel, "caroline")
    assert set(found) == {("diet", "vegan"), ("home_location", "Boston")}
    assert found[("diet", "vegan")].provenance == "reported"
    assert found[("diet", "vegan")].confidence <= 0.5
    assert found[("home_location", "Boston")].provenance == "explicit"
    # The subject saying it themselves later makes it explicit.
    kernel.capture_many(
        "caroline",
        [
            replace(
                say("I'm vegan", day=3), actor="Caroline", context=((SUBJECT_ACTOR, "Caroline"),)
            )
        ],
    )
    assert _current(kernel, "caroline")[("diet", "vegan")].provenance == "explicit"
