"""The learned fusion knobs of round 10 (``SliceOptions.learned_weights``, ``learned_share``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.retrieval.factories import NOW
from tests.retrieval.test_rank_fusion import PLAIN, _case
from uprof.retrieval.ranker import (
    LEARNED_FEATURES,
    SHARE_FEATURES,
    analyse_query,
    hand_relevance,
    learned_features,
    memory_relevance,
    rank_memories,
)


def _weights(**by_name: float) -> tuple[float, ...]:
    return tuple(by_name.get(name, 0.0) for name in LEARNED_FEATURES)


def test_weight_on_the_hand_relevance_alone_keeps_the_hand_ranking() -> None:
    index, query_vector = _case()
    query = analyse_query("How was the marathon?")
    hand = rank_memories(index, query, query_vector, NOW, PLAIN)
    learned = rank_memories(
        index, query, query_vector, NOW, replace(PLAIN, learned_weights=_weights(relevance=2.0))
    )
    assert learned.rows.tolist() == hand.rows.tolist()
    assert learned.utility.tolist() == hand.utility.tolist()
    assert learned.best == hand.best


def test_the_learned_score_reorders_and_the_hand_values_are_handed_out_in_its_order() -> None:
    index, query_vector = _case()
    query = analyse_query("How was the marathon?")
    hand = rank_memories(index, query, query_vector, NOW, PLAIN)
    # Dense alone puts m1 (closest in meaning, no word match) first, where the hand
    # fusion's lexical share puts m0 (the only word match) first.
    options = replace(PLAIN, learned_weights=_weights(dense=1.0))
    learned = rank_memories(index, query, query_vector, NOW, options)
    assert hand.rows[0] == 0
    assert learned.rows[0] == 1
    assert learned.utility.tolist() == hand.utility.tolist()  # same values, new order
    assert learned.best == hand.best  # profile lines are measured against the same best


def test_features_are_the_hand_fusions_parts() -> None:
    index, query_vector = _case()
    query = analyse_query("How was the marathon?")
    signals, relevance, bridged = hand_relevance(index, query, query_vector, NOW, PLAIN)
    features = learned_features(index, signals, relevance, bridged)
    assert features.shape == (len(index), len(LEARNED_FEATURES))
    column = {name: features[:, i] for i, name in enumerate(LEARNED_FEATURES)}
    assert column["relevance"].tolist() == pytest.approx(relevance.tolist())
    assert column["lexical"].tolist() == pytest.approx(signals.lexical.tolist())
    fused = signals.weight * signals.lexical + (1 - signals.weight) * signals.dense
    assert signals.fused.tolist() == pytest.approx(fused.tolist(), rel=1e-6)
    assert column["coverage_x_lexical"].tolist() == pytest.approx(
        (signals.coverage * signals.lexical).tolist()
    )


def test_a_constant_learned_share_is_a_fixed_lexical_weight() -> None:
    index, query_vector = _case()
    query = analyse_query("How was the marathon?")
    share = tuple(0.4 if name == "constant" else 0.0 for name in SHARE_FEATURES)
    fixed, w_fixed, _ = memory_relevance(
        index, query, query_vector, NOW, replace(PLAIN, lexical_weight=0.4)
    )
    learned, w_learned, _ = memory_relevance(
        index, query, query_vector, NOW, replace(PLAIN, learned_share=share)
    )
    assert w_learned == pytest.approx(w_fixed)
    assert learned.tolist() == fixed.tolist()


def test_a_learned_share_is_clipped_to_a_share() -> None:
    index, query_vector = _case()
    query = analyse_query("How was the marathon?")
    share = tuple(5.0 if name == "constant" else 0.0 for name in SHARE_FEATURES)
    _, weight, _ = memory_relevance(
        index, query, query_vector, NOW, replace(PLAIN, learned_share=share)
    )
    assert weight == 1.0
