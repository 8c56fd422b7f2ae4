"""build_slice: the budget contract, the left-out report and how each layer is served."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from datetime import timedelta

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from domain.values import CATEGORIES, Layer, Provenance
from tests.retrieval.factories import NOW, T0, attribute, conversation, intent, memory
from uprof.adapters.embeddings import HashingEmbedder
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import Candidate, MemoryIndex, PackedSlice, SliceOptions, build_slice

EMBEDDER = HashingEmbedder()
COUNTER = TiktokenCounter()


def _slice(
    query: str,
    memories: list[Candidate],
    budget: int,
    *,
    attributes: list[Candidate] | None = None,
    intents: list[Candidate] | None = None,
    dense: bool = True,
    options: SliceOptions | None = None,
) -> PackedSlice:
    vectors = EMBEDDER.embed([m.text for m in memories]) if dense and memories else None
    index = MemoryIndex.build(memories, vectors, COUNTER)
    return build_slice(
        query=query,
        attributes=attributes or [],
        intents=intents or [],
        memory_index=index,
        budget_tokens=budget,
        counter=COUNTER,
        query_vector=EMBEDDER.embed([query])[0] if dense else None,
        now=NOW,
        options=options or SliceOptions(),
    )


def _all_ids(*groups: list[Candidate]) -> set[str]:
    return {c.item_id for group in groups for c in group}


# --- the budget and the report, for any input ---------------------------------------

_WORDS = st.sampled_from(
    "dog cat paint sunrise lake support group adoption Sweden pottery camping kids job "
    "vegan <|endoftext|> 🙂 naïve \n\t the a when did what".split(" ")
)
_TEXT = st.lists(_WORDS, min_size=0, max_size=40).map(" ".join)


@st.composite
def _scenario(
    draw: st.DrawFn,
) -> tuple[list[Candidate], list[Candidate], list[Candidate], str, int, bool]:
    n_mem = draw(st.integers(0, 40))
    memories = [
        Candidate(
            item_id=f"m{i}",
            layer=Layer.MEMORY,
            category=draw(st.sampled_from(["conversation", "experience"])),
            text=draw(_TEXT),
            confidence=draw(st.floats(0, 1)),
            provenance=draw(st.sampled_from(list(Provenance))),
            evidence=(f"e{i}",),
            source_refs=(f"r{i}",),
            occurred_at=draw(
                st.none() | st.just(T0 + timedelta(minutes=draw(st.integers(0, 5000))))
            ),
            actor=draw(st.sampled_from(["", "Caroline", "Melanie"])),
            heat=draw(st.floats(0, 10)),
        )
        for i in range(n_mem)
    ]
    attrs = [
        attribute(
            f"a{i}",
            draw(st.sampled_from(CATEGORIES)),
            draw(_TEXT),
            confidence=draw(st.floats(0, 1)),
            provenance=draw(st.sampled_from(list(Provenance))),
        )
        for i in range(draw(st.integers(0, 6)))
    ]
    intents = [
        intent(f"i{i}", draw(_TEXT), status=draw(st.sampled_from(["active", "fulfilled", ""])))
        for i in range(draw(st.integers(0, 4)))
    ]
    budget = draw(st.integers(0, 20) | st.integers(0, 600))
    return memories, attrs, intents, draw(_TEXT), budget, draw(st.booleans())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scenario())
def test_never_over_budget_and_every_candidate_accounted_for(
    scenario: tuple[list[Candidate], list[Candidate], list[Candidate], str, int, bool],
) -> None:
    memories, attrs, intents, query, budget, dense = scenario
    packed = _slice(query, memories, budget, attributes=attrs, intents=intents, dense=dense)
    assert packed.n_tokens == COUNTER.count(packed.text) <= budget
    shown = [c.item_id for c in packed.items]
    dropped = [lo.item_id for lo in packed.left_out]
    assert len(set(shown)) == len(shown) and len(set(dropped)) == len(dropped)
    assert set(shown).isdisjoint(dropped)
    assert set(shown) | set(dropped) == _all_ids(memories, attrs, intents)
    assert all(lo.reason in ("budget", "duplicate", "low_relevance") for lo in packed.left_out)
    assert (packed.text == "") == (not packed.items)
    for item in packed.items:
        flat = " ".join(item.text.split())
        if item.layer == Layer.INTENT:  # an intent may be shown summarised: a prefix and "…"
            assert flat in packed.text or any(
                line.endswith("…") and flat.startswith(line[len("- goal: ") : -1].rstrip())
                for line in packed.text.splitlines()
            )
        else:
            assert flat and flat in packed.text


def test_tiny_budgets_give_an_empty_or_minimal_slice() -> None:
    memories = conversation([("Caroline", "I adopted a dog named Max in 2022.")])
    for budget in range(21):
        packed = _slice("dog", memories, budget)
        assert packed.n_tokens <= budget
        if packed.items:
            assert packed.text.endswith("I adopted a dog named Max in 2022.")
    assert _slice("dog", memories, 0).text == ""
    assert _slice("dog", memories, 40).items == tuple(memories)


def test_budget_drops_are_reported_with_their_reason() -> None:
    memories = conversation(
        [("Melanie", f"I painted a sunrise over the lake, picture number {i}.") for i in range(30)]
    )
    packed = _slice("painted sunrise", memories, 120)
    reasons = Counter(lo.reason for lo in packed.left_out)
    assert packed.items and reasons["budget"] > 0
    assert len(packed.items) + len(packed.left_out) == 30


# --- memories -------------------------------------------------------------------------


def test_memories_render_chronologically_with_day_and_speaker() -> None:
    memories = [
        memory(
            "late", "We went camping with the kids.", at=T0 + timedelta(days=30), actor="Melanie"
        ),
        memory("early", "I went camping alone at the lake.", at=T0, actor="Caroline"),
    ]
    packed = _slice("camping", memories, 200)
    assert packed.text.splitlines()[-4:] == [
        "[8 May 2023]",
        "Caroline: I went camping alone at the lake.",
        "[7 June 2023]",
        "Melanie: We went camping with the kids.",
    ]
    assert [c.item_id for c in packed.items] == ["early", "late"]
    flat = _slice("camping", memories, 200, options=SliceOptions(group_memories_by_day=False))
    assert "[8 May 2023] Caroline: I went camping alone at the lake." in flat.text.splitlines()


def test_relevant_memory_wins_a_tight_budget_in_both_modes() -> None:
    filler = [("Melanie", f"Work was busy this week, meeting number {i}.") for i in range(40)]
    turns = [
        *filler[:20],
        ("Caroline", "My grandma gave me this necklace in Sweden."),
        *filler[20:],
    ]
    for dense in (True, False):
        packed = _slice(
            "Where did Caroline's necklace come from?", conversation(turns), 32, dense=dense
        )
        assert [c.text for c in packed.items] == ["My grandma gave me this necklace in Sweden."]


def test_mmr_removes_near_duplicates() -> None:
    text = "I signed up for a pottery class yesterday, it is like therapy."
    memories = [
        memory("a", text, at=T0),
        memory("b", text, at=T0 + timedelta(days=1)),
        memory("c", "The pottery class teacher showed us glazing.", at=T0 + timedelta(days=2)),
    ]
    packed = _slice("pottery class", memories, 500)
    shown = {c.item_id for c in packed.items}
    assert len(shown & {"a", "b"}) == 1 and "c" in shown
    dup = [lo for lo in packed.left_out if lo.item_id in {"a", "b"}]
    assert [lo.reason for lo in dup] == ["duplicate"]


def test_adjacent_turn_completes_a_question_answer_pair() -> None:
    noise = [("Melanie", f"Random chat about the weather, part {i}.") for i in range(30)]
    pair = [("Melanie", "What instrument did you pick up last month?"), ("Caroline", "The violin!")]
    memories = conversation([*noise[:15], *pair, *noise[15:]])
    packed = _slice("What instrument did Caroline pick up?", memories, 60)
    texts = [c.text for c in packed.items]
    assert "The violin!" in texts


# --- attributes and intents --------------------------------------------------------------


def test_category_bonus_when_enabled_lifts_attributes_the_query_points_at() -> None:
    # Off by default (decision 0033-multi-hop-and-preferences); the knob still works.
    attrs = [
        attribute("job", "occupation", "works as a nurse"),
        attribute("diet", "diet", "vegetarian"),
        attribute("pet", "pet", "has a cat"),
    ]
    options = SliceOptions(category_weight=0.2)
    query = "Suggest a restaurant for dinner tonight"
    packed = _slice(query, [], 10, attributes=attrs, options=options)
    assert [c.item_id for c in packed.items] == ["diet"]
    bigger = _slice(query, [], 200, attributes=attrs, options=options)
    assert bigger.items[0].item_id == "diet" and len(bigger.items) == 3


def test_provenance_marks_are_compact_and_only_where_needed() -> None:
    attrs = [
        attribute("diet", "diet", "vegetarian"),
        attribute(
            "city", "location", "lives in Lisbon", confidence=0.4, provenance=Provenance.INFERRED
        ),
        attribute("old", "location", "lives in Porto", status="conflicting"),
    ]
    text = _slice("where does she live and eat", [], 200, attributes=attrs).text
    lines = text.splitlines()
    assert lines[0] == "Profile (explicit unless marked):"
    assert "- diet: vegetarian" in lines
    assert "- location: lives in Lisbon (inferred 0.4)" in lines
    assert "- location: lives in Porto (conflicting)" in lines


def test_intents_shown_when_relevant_and_inactive_ones_left_out() -> None:
    intents = [
        intent("trip", "Plan a hiking trip to the Alps in July with two friends."),
        intent("done", "Buy a new laptop.", status="fulfilled"),
    ]
    packed = _slice("hiking trip ideas", [], 200, intents=intents)
    assert [c.item_id for c in packed.items] == ["trip"]
    assert "- goal: Plan a hiking trip to the Alps in July with two friends." in packed.text
    assert [(lo.item_id, lo.reason) for lo in packed.left_out] == [("done", "low_relevance")]


def test_long_intent_is_summarised_when_the_budget_is_tight() -> None:
    long_text = (
        "Find an adoption agency that supports LGBTQ parents. She wants to start before the end "
        "of the year, has contacted several agencies and is comparing their waiting times."
    )
    packed = _slice("adoption agency", [], 30, intents=[intent("adopt", long_text)])
    assert packed.items and packed.items[0].item_id == "adopt"
    assert "…" in packed.text and packed.n_tokens <= 30


# --- determinism -----------------------------------------------------------------------


def test_same_inputs_in_any_order_give_the_same_slice() -> None:
    turns = [
        ("Caroline" if i % 2 else "Melanie", f"We talked about topic {i % 7} again.")
        for i in range(60)
    ]
    memories = conversation(turns)
    attrs = [attribute("a", "pet", "has a dog"), attribute("b", "pet", "has a cat")]  # tie
    first = _slice("topic 3 pets", memories, 150, attributes=attrs)
    shuffled = list(memories)
    random.Random(3).shuffle(shuffled)
    again = _slice("topic 3 pets", shuffled, 150, attributes=list(reversed(attrs)))
    assert first.text == again.text
    assert first.items == again.items
    assert first.left_out == again.left_out


def test_lexical_only_mode_needs_no_vectors() -> None:
    memories = conversation([("Caroline", "I love pottery."), ("Melanie", "I run every morning.")])
    index = MemoryIndex.build(memories, None, COUNTER)
    assert index.vectors is None
    packed = build_slice(
        query="running",
        attributes=(),
        intents=(),
        memory_index=index,
        budget_tokens=22,
        counter=COUNTER,
        query_vector=None,
        now=NOW,
    )
    assert [c.text for c in packed.items] == ["I run every morning."]


def test_heat_breaks_ties_between_equally_relevant_memories() -> None:
    memories = [
        memory("hot", "Went to the gym!", at=T0, heat=5.0),  # older, so recency favours "cold"
        memory("cold", "Went to the gym.", at=T0 + timedelta(days=1), heat=0.0),
    ]
    packed = _slice("gym", memories, 30, options=SliceOptions(duplicate_threshold=1.1))
    assert [c.item_id for c in packed.items] == ["hot"]


def test_query_vector_changes_nothing_about_the_contract() -> None:
    memories = conversation([("A", f"line {i}") for i in range(10)])
    index = MemoryIndex.build(memories, EMBEDDER.embed([m.text for m in memories]), COUNTER)
    zero = np.zeros(384, dtype=np.float32)
    packed = build_slice(
        query="",
        attributes=(),
        intents=(),
        memory_index=index,
        budget_tokens=50,
        counter=COUNTER,
        query_vector=zero,
        now=NOW,
    )
    assert packed.n_tokens <= 50


def test_candidate_is_a_frozen_value() -> None:
    m = memory("x", "text")
    assert replace(m, text="other").text == "other" and m.text == "text"
