"""The free-text gate on its own (decision 0016): no storage."""

from __future__ import annotations

from domain.values import CATEGORIES
from uprof.services.memory_gate import RevealGate

ALL = dict.fromkeys(CATEGORIES, "")


def gate(**withheld: str) -> RevealGate:
    return RevealGate.build(
        {**ALL, **withheld},
        items=[("location", ("c1",)), ("pet", ("c2",))],
        values=[("location", "Lisbon"), ("pet", "dog named Luna"), ("diet", "vegan")],
    )


def test_everything_allowed_serves_everything() -> None:
    g = gate()
    assert g.reason(("conversation", "health"), ("c1",), ("I live in Lisbon",)) == ""
    assert not g.hides("Lisbon")


def test_every_category_of_the_memory_must_be_allowed() -> None:
    g = gate(health="consent")
    assert g.reason(("conversation",), (), ("hi",)) == ""
    assert g.reason(("conversation", "health"), (), ("hi",)) == "consent"
    assert g.reason(("conversation", "gossip"), (), ("hi",)) == "policy"  # unknown: denied


def test_star_stands_for_every_category() -> None:
    assert gate(pet="policy").reason(("*",), (), ("bread",)) == "policy"
    assert gate().reason(("*",), (), ("bread",)) == ""


def test_the_capture_links_its_items_categories_to_the_memory() -> None:
    g = gate(location="policy")
    assert g.reason(("conversation",), ("c1",), ("nothing to see",)) == "policy"
    assert g.reason(("conversation",), ("c2",), ("nothing to see",)) == ""
    assert g.reason(("goal",), ("c1",), ("run",), link=False) == ""


def test_withheld_values_withhold_text_by_whole_word() -> None:
    g = gate(pet="policy")
    assert g.reason(("conversation",), (), ("Luna chased a ball",)) == "policy"
    assert g.reason(("conversation",), (), ("my dog named luna",)) == "policy"
    assert g.reason(("conversation",), (), ("Lunatic weather",)) == ""
    assert g.hides("Luna") and not g.hides("Lisbon")


def test_policy_wins_over_consent_and_detection_runs_when_asked() -> None:
    g = gate(location="consent", health="policy")
    assert g.reason(("goal",), (), ("move to Lisbon",)) == "consent"
    assert g.reason(("goal",), (), ("see my doctor",)) == ""
    assert g.reason(("goal",), (), ("see my doctor",), detect=True) == "policy"
