"""Semantic bridges, profile lines beside their source memories, and the legend's cost."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.values import Provenance
from tests.retrieval.factories import NOW, T0, attribute, memory
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import MemoryIndex, SliceOptions, build_slice
from uprof.retrieval.ranker import analyse_query, rank_memories
from uprof.retrieval.render import LEGEND

COUNTER = TiktokenCounter()
DIM = 8


def _unit(*weights: float) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[: len(weights)] = weights
    return v / np.linalg.norm(v)


# Axis 0 is what the question means; axis 1 "outdoor hobbies"; the rest unrelated topics.
QUERY = _unit(1.0)
SEED = _unit(1.0, 1.0)  # answers the question and is an outdoor hobby
SIBLING = _unit(0.0, 1.0, 0.1)  # another outdoor hobby: shares nothing with the question
STRANGERS = [_unit(0.05, 0.0, *([0.0] * k), 1.0) for k in range(4)]  # four unrelated topics


def _bridge_case() -> tuple[MemoryIndex, list[str]]:
    texts = [
        "I signed up for a pottery class yesterday.",
        "We went camping with the kids last weekend.",
        "Work was busy.",
        "The car needs new tyres.",
        "My phone broke.",
        "Taxes are due soon.",
    ]
    memories = [
        memory(f"m{i}", text, at=T0 + timedelta(days=i), actor="Melanie")
        for i, text in enumerate(texts)
    ]
    vectors = np.stack([SEED, SIBLING, *STRANGERS])
    return MemoryIndex.build(memories, vectors, COUNTER), texts


def _ranked_ids(index: MemoryIndex, options: SliceOptions) -> list[str]:
    query = analyse_query("What does Melanie do for fun?")
    ranking = rank_memories(index, query, QUERY, NOW, options)
    return [index.candidates[r].item_id for r in ranking.rows]


def test_a_bridge_lifts_the_sibling_of_the_best_hit_above_unrelated_memories() -> None:
    index, _ = _bridge_case()
    bridged = _ranked_ids(index, SliceOptions(bridge_weight=0.5))
    assert bridged[:2] == ["m0", "m1"]
    plain = _ranked_ids(index, SliceOptions(bridge_weight=0.0))
    assert plain[0] == "m0" and plain.index("m1") > 1  # without the bridge it sinks


def test_a_bridged_memory_never_outranks_the_seed_it_came_through() -> None:
    index, _ = _bridge_case()
    query = analyse_query("What does Melanie do for fun?")
    ranking = rank_memories(index, query, QUERY, NOW, SliceOptions(bridge_weight=1.0))
    utility = dict(
        zip([index.candidates[r].item_id for r in ranking.rows], ranking.utility, strict=True)
    )
    assert utility["m0"] == 1.0 and utility["m1"] <= utility["m0"]


@settings(max_examples=60, deadline=None)
@given(
    vectors=st.lists(
        st.lists(st.floats(-1, 1, allow_nan=False), min_size=DIM, max_size=DIM),
        min_size=1,
        max_size=12,
    ),
    query=st.lists(st.floats(-1, 1, allow_nan=False), min_size=DIM, max_size=DIM),
    weight=st.sampled_from([0.0, 0.5, 1.0]),
)
def test_bridges_only_reorder_the_memories_of_the_index(
    vectors: list[list[float]], query: list[float], weight: float
) -> None:
    memories = [
        memory(f"m{i}", f"note {i}", at=T0 + timedelta(days=i)) for i in range(len(vectors))
    ]
    index = MemoryIndex.build(memories, np.asarray(vectors, dtype=np.float32), COUNTER)
    options = SliceOptions(bridge_weight=weight)
    ranking = rank_memories(
        index, analyse_query("note"), np.asarray(query, dtype=np.float32), NOW, options
    )
    assert sorted(ranking.rows.tolist()) == list(range(len(memories)))
    assert np.all(np.isfinite(ranking.utility)) and np.all(ranking.utility <= 1.0 + 1e-9)


def _pref_slice(budget: int, options: SliceOptions | None = None):
    source = memory("m0", "I can't stand floral patterns on anything I wear.", actor="")
    other = memory("m1", "The weather was lovely on the coast.", actor="", at=T0 + timedelta(1))
    line = replace(
        attribute("a0", "preference", "dislikes: floral patterns", confidence=0.95),
        evidence=source.evidence,
    )
    index = MemoryIndex.build([source, other], None, COUNTER)
    return build_slice(
        query="Which floral patterns would suit me?",
        attributes=[line],
        intents=[],
        memory_index=index,
        budget_tokens=budget,
        counter=COUNTER,
        query_vector=None,
        now=NOW,
        options=options or SliceOptions(),
    )


def test_a_profile_line_and_the_memory_it_came_from_are_not_both_shown() -> None:
    packed = _pref_slice(400)
    shown = {c.item_id for c in packed.items}
    assert len(shown & {"a0", "m0"}) == 1
    repeat = next(lo for lo in packed.left_out if lo.item_id in {"a0", "m0"})
    assert repeat.reason == "duplicate"
    both = _pref_slice(400, SliceOptions(derived_duplicates=False))
    assert {"a0", "m0"} <= {c.item_id for c in both.items}


def test_the_legend_is_paid_only_when_a_line_carries_a_mark() -> None:
    plain = _pref_slice(400)
    assert LEGEND not in plain.text
    marked = memory("m2", "I might move to Porto.", confidence=0.5, actor="")
    marked = replace(marked, provenance=Provenance.INFERRED)
    index = MemoryIndex.build([marked], None, COUNTER)
    packed = build_slice(
        query="Porto",
        attributes=[],
        intents=[],
        memory_index=index,
        budget_tokens=400,
        counter=COUNTER,
        query_vector=None,
        now=NOW,
    )
    assert packed.text.splitlines()[0] == LEGEND and "(inferred 0.5)" in packed.text
    always = _pref_slice(400, SliceOptions(legend_only_when_marked=False))
    assert always.text.splitlines()[0] == LEGEND
