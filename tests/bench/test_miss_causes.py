"""``benchmarks.miss_causes``: the ranker's terms add up, and each cause is the packer's."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from types import SimpleNamespace

import numpy as np

from benchmarks.miss_causes import PackTrace, Terms, budget_cause, gap_term, relevance_terms
from tests.retrieval.factories import NOW, T0, memory
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import MemoryIndex, SliceOptions, packer
from uprof.retrieval.ranker import analyse_query, rank_memories

COUNTER = TiktokenCounter()


def _index() -> tuple[MemoryIndex, np.ndarray]:
    texts = [
        "Sam went camping with the kids at the lake.",
        "Sam signed up for a pottery class.",
        "The weather was awful all week.",
        "We went swimming at the beach, Sam loved it.",
        "Work has been busy lately.",
        "Sam painted a sunset last weekend.",
    ]
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(len(texts), 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    memories = [
        memory(
            f"m{i}",
            t,
            at=T0 + timedelta(seconds=30 * i),
            actor="Sam" if i % 2 else "Ann",
            heat=i / 5,
        )
        for i, t in enumerate(texts)
    ]
    query = vectors[1] + 0.5 * vectors[0]
    return MemoryIndex.build(memories, vectors, COUNTER), query / np.linalg.norm(query)


def test_the_terms_add_up_to_the_rankers_relevance_and_order() -> None:
    index, query_vector = _index()
    got = SimpleNamespace(
        query="What activities does Sam do with pottery?", query_vector=query_vector, now=NOW
    )
    options = replace(SliceOptions(), bridge_seeds=2)
    terms = relevance_terms(index, got, options)
    total = sum(terms.parts.values())
    assert np.allclose(total, terms.relevance, atol=1e-5)
    assert set(terms.parts) == {
        "lexical",
        "dense",
        "speaker",
        "recency/heat",
        "neighbours",
        "bridges",
    }
    assert terms.parts["lexical"].max() > 0 and terms.parts["neighbours"].max() > 0
    ranking = rank_memories(index, analyse_query(got.query), query_vector, NOW, options)
    order = np.argsort(-terms.relevance, kind="stable")
    assert order.tolist() == ranking.rows.tolist()


def test_the_gap_is_named_by_the_term_that_separates_most() -> None:
    parts = {
        name: np.zeros(3)
        for name in ("lexical", "dense", "speaker", "recency/heat", "neighbours", "bridges")
    }
    parts["lexical"][:] = [0.6, 0.5, 0.0]
    parts["dense"][:] = [0.1, 0.2, 0.3]
    terms = Terms(parts, np.sum(list(parts.values()), axis=0))
    assert gap_term(terms, 2, [0, 1]) == "lexical"
    assert gap_term(terms, 2, []) == "none above"


def _trace(utility: list[float], steps: list[tuple[list[float], list[bool], int]]) -> PackTrace:
    problem = SimpleNamespace(utility=np.asarray(utility))
    return PackTrace(
        choices=[],
        problem=problem,  # type: ignore[arg-type]
        steps=[(np.asarray(g), np.asarray(e), t) for g, e, t in steps],
    )


def test_a_choice_that_outgained_the_taken_one_did_not_fit() -> None:
    trace = _trace(
        [1.0, 0.9, 0.5],
        [([1.0, 0.9, 0.5], [True, True, True], 0), ([0, 0.9, 0.5], [False, True, True], 2)],
    )
    assert budget_cause(trace, 1) == "budget: did not fit"


def test_a_choice_beaten_only_after_its_discount_lost_to_marginal_relevance() -> None:
    trace = _trace(
        [1.0, 0.8, 0.6],
        [([1.0, 0.8, 0.6], [True, True, True], 0), ([0, 0.4, 0.6], [False, True, True], 2)],
    )
    assert budget_cause(trace, 1) == "marginal relevance"


def test_a_choice_below_every_taken_one_was_ranked_too_low() -> None:
    trace = _trace(
        [1.0, 0.8, 0.3],
        [([1.0, 0.8, 0.3], [True, True, True], 0), ([0, 0.8, 0.3], [False, True, True], 1)],
    )
    assert budget_cause(trace, 2) == "ranked too low"


def test_the_traced_greedy_takes_what_the_packer_takes() -> None:
    from benchmarks.miss_causes import _traced_pack

    rng = np.random.default_rng(5)
    m = 30
    sims = rng.uniform(0, 1, size=(m, m))
    sims = (sims + sims.T) / 2
    problem = packer.PackProblem(
        costs=rng.integers(5, 60, size=m),
        utility=rng.uniform(0, 1, size=m),
        owner=np.arange(m),
        groups=np.full((m, 1), -1),
        group_costs=np.zeros(0, dtype=np.int64),
        similar_to=lambda j: sims[:, j],
        budget=300,
    )
    trace = PackTrace(choices=[])
    got = _traced_pack(trace)(problem)
    assert got == packer.pack(problem)
    assert trace.steps is not None and [t for *_, t in trace.steps] == list(got.chosen)
