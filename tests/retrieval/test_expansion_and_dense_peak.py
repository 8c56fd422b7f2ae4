"""Lexical pseudo-relevance feedback (RM3-style) and the dense share of peaked queries."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np

from tests.retrieval.factories import NOW, T0, memory
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import MemoryIndex, SliceOptions
from uprof.retrieval.ranker import analyse_query, dense_peak, memory_relevance, rank_memories

COUNTER = TiktokenCounter()
DIM = 16


def _unit(*weights: float) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[: len(weights)] = weights
    return v / np.linalg.norm(v)


def _ranked_ids(
    index: MemoryIndex, question: str, vector: np.ndarray | None, options: SliceOptions
) -> list[str]:
    ranking = rank_memories(index, analyse_query(question), vector, NOW, options)
    return [index.candidates[r].item_id for r in ranking.rows]


# -- expansion ------------------------------------------------------------------------


def _expansion_case() -> MemoryIndex:
    # The question names a category; "seed" matches it by its words and names an instance
    # ("veterans"); "sibling" shares only that instance's word with it, nothing with the
    # question. The sibling is the oldest memory, so recency alone puts it last.
    texts = {
        "sibling": "The veterans parade downtown was so moving.",
        "seed": "I support causes like the veterans hospital fundraiser.",
        "s1": "Work was busy this week.",
        "s2": "The car needs new tyres.",
        "s3": "My phone broke again.",
        "s4": "Taxes are due soon.",
    }
    memories = [
        memory(name, text, at=T0 + timedelta(days=i), actor="Melanie")
        for i, (name, text) in enumerate(texts.items())
    ]
    return MemoryIndex.build(memories, None, COUNTER)


QUESTION = "What causes does Melanie support?"
NO_FLOW = SliceOptions(neighbour_weight=0.0, bridge_weight=0.0)


def test_expansion_lifts_a_memory_sharing_only_the_best_hits_words() -> None:
    index = _expansion_case()
    on = SliceOptions(neighbour_weight=0.0, bridge_weight=0.0, expansion_weight=0.3)
    ranked = _ranked_ids(index, QUESTION, None, on)
    assert ranked[:2] == ["seed", "sibling"]


def test_without_expansion_the_sibling_gets_no_lexical_credit() -> None:
    index = _expansion_case()
    ranked = _ranked_ids(index, QUESTION, None, NO_FLOW)
    assert ranked[0] == "seed"
    assert ranked[-1] == "sibling"  # only recency: the oldest memory is last


def test_expansion_never_lowers_a_direct_match() -> None:
    # Two memories match the question as a whole; the feedback words come mostly from the
    # longer one. "max" keeps every memory's own lexical score as a floor, so the short
    # direct match keeps exactly its relevance; RM3's interpolation ("mix") would lower it.
    memories = [
        memory("short", "Causes I support matter.", at=T0, actor="Melanie"),
        memory(
            "long",
            "I support causes like the veterans hospital fundraiser.",
            at=T0 + timedelta(days=1),
            actor="Melanie",
        ),
        *[
            memory(f"s{i}", text, at=T0 + timedelta(days=2 + i), actor="Melanie")
            for i, text in enumerate(["Work was busy.", "The car needs tyres.", "Taxes due."])
        ],
    ]
    index = MemoryIndex.build(memories, None, COUNTER)
    query = analyse_query(QUESTION)

    def relevance(options: SliceOptions) -> float:
        fused, *_ = memory_relevance(index, query, None, NOW, options)
        return float(fused[0])  # "short" is the oldest memory: row 0

    lifted = SliceOptions(neighbour_weight=0.0, bridge_weight=0.0, expansion_weight=0.3)
    assert relevance(lifted) == relevance(NO_FLOW)
    assert relevance(replace(lifted, expansion_mix="mix")) < relevance(NO_FLOW)


# -- dense peak -----------------------------------------------------------------------

GOLD = _unit(1.0, 0.2)
QUERY = _unit(1.0)


def _peak_case() -> tuple[MemoryIndex, np.ndarray]:
    # "gold" is the only memory close in meaning and shares no word with the question;
    # "partial" shares two of its words and is unrelated in meaning, like the rest.
    texts = {
        "gold": "Long flights make me miserable, I always take the train.",
        "partial": "We browsed the weekend market on our trip to Lyon.",
        "s1": "Work was busy this week.",
        "s2": "The car needs new tyres.",
        "s3": "My phone broke again.",
        "s4": "Taxes are due soon.",
        "s5": "The dentist moved my appointment.",
        "s6": "I repainted the fence.",
    }
    memories = [
        memory(name, text, at=T0 + timedelta(days=i), actor="Ana")
        for i, (name, text) in enumerate(texts.items())
    ]
    others = [_unit(0.1, 0.0, *([0.0] * k), 1.0) for k in range(len(texts) - 1)]
    return MemoryIndex.build(memories, np.stack([GOLD, *others]), COUNTER), QUERY


def test_a_sharply_peaked_dense_match_outranks_a_partial_word_match() -> None:
    index, query = _peak_case()
    question = "Any ideas for a weekend trip?"
    assert _ranked_ids(index, question, query, NO_FLOW)[0] == "partial"
    on = SliceOptions(neighbour_weight=0.0, bridge_weight=0.0, dense_peak_weight=1.0)
    assert _ranked_ids(index, question, query, on)[0] == "gold"


def test_dense_peak_reads_the_querys_own_distribution() -> None:
    # Scaled dense scores: the best is 1 and the median 0.
    peaked = np.asarray([1.0, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0])
    flat = np.asarray([1.0, 0.95, 0.9, 0.9, 0.85, 0.0, 0.0])
    assert dense_peak(peaked, 3) == 1.0
    assert abs(dense_peak(flat, 3) - 0.1) < 1e-9
    assert dense_peak(flat, 10) == 0.0  # too few memories to say
    assert dense_peak(flat, 1) == 0.0  # the best against itself says nothing
