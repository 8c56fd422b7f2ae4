"""Late interaction: MaxSim over token vectors re-scores the first stage's best memories."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest

from tests.retrieval.factories import NOW, T0, attribute, memory
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import MemoryIndex, SliceOptions
from uprof.retrieval.late import LateScale, maxsim
from uprof.retrieval.ranker import analyse_query, rank_memories, rank_profile_items

COUNTER = TiktokenCounter()
DIM = 8


def _unit(*weights: float) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[: len(weights)] = weights
    return v / np.linalg.norm(v)


E1, E2, E3, E4 = (_unit(*([0.0] * i + [1.0])) for i in range(4))
#: The fake model's token vectors, by word; other words have none.
TOKENS = {
    "restaurants": E1,
    "tonight": E2,
    "recommend": E3,
    "vegan": E1,
    "evening": E2,
    "place": _unit(1.0, 1.0, 1.0),
    "chores": E4,
}


class FakeTokens:
    """Token vectors by word from ``TOKENS``; counts how many texts it was asked for."""

    def __init__(self) -> None:
        self.asked = 0

    def token_vectors(self, texts: Sequence[str]) -> list[np.ndarray]:
        self.asked += len(texts)
        return [
            np.asarray(
                [TOKENS[w] for w in re.findall(r"[a-z]+", t.lower()) if w in TOKENS],
                dtype=np.float32,
            ).reshape(-1, DIM)
            for t in texts
        ]


QUESTION = "Recommend restaurants tonight?"
QUERY = _unit(1.0)
NO_FLOW = SliceOptions(neighbour_weight=0.0, bridge_weight=0.0)


def _index() -> MemoryIndex:
    # No memory shares a word with the question, so the dense score decides. "place" is
    # the closest by sentence vector, a blend of every query token matched by none;
    # "gold" is further by sentence vector but holds two of the question's tokens exactly
    # ("vegan" ~ restaurants, "evening" ~ tonight). "gold" is the oldest, so recency
    # favours the others.
    specs = [
        ("gold", "Vegan food only, and only in the evening.", _unit(0.6, 0.8)),
        ("place", "That place was nice.", _unit(0.9, 0.44)),
        *[(f"s{i}", f"Chores again {i}.", _unit(0.1, 0.0, 0.0, 1.0)) for i in range(4)],
    ]
    memories = [
        memory(name, text, at=T0 + timedelta(days=i)) for i, (name, text, _) in enumerate(specs)
    ]
    vectors = np.stack([v for *_, v in specs])
    return MemoryIndex.build(memories, vectors, COUNTER)


def _ranked(options: SliceOptions, tokens: FakeTokens | None) -> list[str]:
    index = _index()
    ranking = rank_memories(index, analyse_query(QUESTION), QUERY, NOW, options, tokens=tokens)
    return [index.candidates[r].item_id for r in ranking.rows]


def test_maxsim_is_the_mean_over_query_tokens_of_the_best_document_token() -> None:
    query = np.stack([E1, E2, E3])
    documents = [np.stack([E1, E2]), np.stack([_unit(1.0, 1.0, 1.0)]), np.zeros((0, DIM))]
    got = maxsim(query, documents)
    assert got == pytest.approx([2 / 3, 1 / np.sqrt(3), 0.0])


def test_late_scale_over_the_whole_index_is_the_rankers_scale() -> None:
    # The median MaxSim (0.3) goes to 0 and the best (0.9) to 1, as the ranker scales
    # cosines (scaled cosines over the whole index have median 0 and best 1).
    late = np.asarray([0.2, 0.5, 0.3, 0.9, 0.1])
    dense = np.asarray([0.0, 0.4, 0.0, 1.0, 0.0])
    scaled = LateScale.of(late, dense)(late, dense)
    assert scaled == pytest.approx([0.0, 1 / 3, 0.0, 1.0, 0.0])


def test_late_interaction_lifts_the_memory_holding_the_query_tokens() -> None:
    tokens = FakeTokens()
    assert _ranked(NO_FLOW, tokens)[0] == "place"
    assert tokens.asked == 0  # off by default: no token vectors asked for
    on = replace(NO_FLOW, late_weight=1.0)
    assert _ranked(on, tokens)[:2] == ["gold", "place"]
    assert tokens.asked == 1 + 6  # the question and the six candidates


def test_without_a_token_embedder_the_knob_does_nothing() -> None:
    assert _ranked(replace(NO_FLOW, late_weight=1.0), None) == _ranked(NO_FLOW, None)


def test_only_the_first_stages_best_are_rescored() -> None:
    tokens = FakeTokens()
    on = replace(NO_FLOW, late_weight=1.0, late_candidates=1)
    # Only "place", the first stage's best, is re-scored: it is the sole candidate, so
    # MaxSim cannot tell it from anything and its dense score stays.
    assert _ranked(on, tokens) == _ranked(NO_FLOW, None)
    assert tokens.asked == 1 + 1


def test_profile_lines_are_rescored_on_the_same_scale() -> None:
    index = _index()
    query = analyse_query(QUESTION)
    lines = [attribute("a-gold", "diet", "vegan evening"), attribute("a-place", "misc", "place")]
    vectors = np.stack([_unit(0.6, 0.8), _unit(0.9, 0.44)])

    def utilities(options: SliceOptions, tokens: FakeTokens | None) -> list[float]:
        ranking = rank_memories(index, query, QUERY, NOW, options, tokens=tokens)
        got = rank_profile_items(
            lines, query, vectors, QUERY, 0.0, index=index, ranking=ranking, options=options
        )
        return [float(u) for u in got]

    off = utilities(NO_FLOW, FakeTokens())
    on = utilities(replace(NO_FLOW, late_weight=1.0), FakeTokens())
    assert off[0] < off[1]
    assert on[0] > on[1]
