"""Cluster-level evidence (``SliceOptions.cluster_weight``, decision XXXX-retrieval-round-11)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest

from tests.retrieval.factories import NOW, T0, memory
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import MemoryIndex, SliceOptions
from uprof.retrieval.index import spherical_kmeans
from uprof.retrieval.ranker import analyse_query, cluster_count, memory_relevance, rank_memories

COUNTER = TiktokenCounter()
PLAIN = SliceOptions(recency_weight=0.0, heat_weight=0.0, actor_weight=0.0)


def _unit_rows(matrix: np.ndarray) -> np.ndarray:
    out = np.asarray(matrix, dtype=np.float32)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def _case() -> tuple[MemoryIndex, np.ndarray]:
    """Three instances of one theme, each well off the question's axis (their mean is near
    it), a memory a little closer to the question than any one of them but whose
    neighbours are about something else, and unrelated memories; no memory shares a word
    with the question."""
    dim = 8
    rows = []
    for i in range(3):  # m0-m2: the instances
        v = np.zeros(dim)
        v[0], v[1 + i] = 1.0, 1.6
        rows.append(v)
    lone = np.zeros(dim)
    lone[0], lone[5] = 1.0, 1.4  # m3: leans towards m4-m6's topic
    rows.append(lone)
    for i in range(6):  # m4-m9: another topic
        v = np.zeros(dim)
        v[5 + i % 3] = 1.0
        v[5] += 1.0 + 0.1 * i
        rows.append(v)
    texts = [f"turn number {i} about things" for i in range(len(rows))]
    memories = [
        memory(f"m{i}", t, at=T0 + timedelta(days=i), actor="Sam") for i, t in enumerate(texts)
    ]
    query = np.zeros(dim)
    query[0] = 1.0
    return MemoryIndex.build(memories, _unit_rows(np.stack(rows)), COUNTER), query.astype(
        np.float32
    )


def test_kmeans_is_deterministic_and_its_centroids_are_unit_means() -> None:
    rng = np.random.default_rng(3)
    vectors = _unit_rows(rng.standard_normal((200, 16)))
    labels, centroids = spherical_kmeans(vectors, 15)
    again, centroids_again = spherical_kmeans(vectors, 15)
    assert np.array_equal(labels, again) and np.array_equal(centroids, centroids_again)
    assert labels.min() >= 0 and labels.max() < 15
    assert np.linalg.norm(centroids, axis=1) == pytest.approx(np.ones(15), rel=1e-5)
    for c in np.unique(labels):
        mean = vectors[labels == c].mean(axis=0)
        assert centroids[c] == pytest.approx(mean / np.linalg.norm(mean), abs=1e-5)
    # Each row sits with the centroid it is most similar to (Lloyd's fixed point).
    assert np.array_equal(np.argmax(vectors @ centroids.T, axis=1), labels)


def test_kmeans_finds_well_separated_groups() -> None:
    rng = np.random.default_rng(5)
    axes = np.eye(8)[:3]
    vectors = _unit_rows(np.repeat(axes, 20, axis=0) + 0.05 * rng.standard_normal((60, 8)))
    labels, _ = spherical_kmeans(vectors, 3)
    assert sorted(len(set(labels[i * 20 : (i + 1) * 20].tolist())) for i in range(3)) == [1, 1, 1]
    assert len(set(labels.tolist())) == 3


def test_cluster_count_is_a_function_of_the_subject_size() -> None:
    assert [cluster_count(n, 0.0) for n in (0, 1, 4, 5, 600, 5000)] == [0, 1, 2, 3, 25, 71]
    assert [cluster_count(n, 10.0) for n in (5, 600, 5000)] == [1, 60, 500]


def test_off_by_default_and_off_leaves_the_relevance_unchanged() -> None:
    index, query_vector = _case()
    query = analyse_query("What are his hobbies?")
    assert SliceOptions().cluster_weight == 0.0
    plain, *_ = memory_relevance(index, query, query_vector, NOW, PLAIN)
    assert index._clusters == {}  # never computed when off
    zero = replace(PLAIN, cluster_weight=0.0, cluster_mode="max", cluster_members=2.0)
    again, *_ = memory_relevance(index, query, query_vector, NOW, zero)
    assert np.array_equal(plain, again) and index._clusters == {}


def _relevance(mode: str, weight: float) -> tuple[MemoryIndex, np.ndarray, np.ndarray]:
    index, query_vector = _case()
    query = analyse_query("What are his hobbies?")
    options = replace(PLAIN, cluster_weight=weight, cluster_mode=mode, cluster_members=5.0)
    plain, *_ = memory_relevance(index, query, query_vector, NOW, PLAIN)
    clustered, *_ = memory_relevance(index, query, query_vector, NOW, options)
    labels, _ = index.clusters(cluster_count(len(index), 5.0))  # 2 clusters of 10
    assert len(set(labels[:3].tolist())) == 1 and labels[3] not in labels[:3]
    return index, plain, clustered


def test_a_theme_lifts_instances_none_of_which_matches_alone() -> None:
    _, plain, clustered = _relevance("mix", 0.4)
    # Rows are chronological: m0-m2 the instances, m3 the memory with other neighbours.
    assert max(plain[:3]) < plain[3]  # alone, m3 matches best
    assert min(clustered[:3]) > clustered[3]  # as a group, the instances do
    # The instances' centroid matches better than the best memory: full evidence, 1.
    assert clustered[:3] == pytest.approx(0.6 * plain[:3] + 0.4, rel=1e-6)


def test_max_mode_lifts_to_the_weighted_evidence_and_lowers_nothing() -> None:
    _, plain, clustered = _relevance("max", 0.95)
    assert clustered[:3] == pytest.approx([0.95] * 3, rel=1e-6)
    assert np.all(clustered >= plain) and clustered[3] == plain[3]


def test_clusters_are_kept_per_index_and_count() -> None:
    index, query_vector = _case()
    options = replace(PLAIN, cluster_weight=0.3)
    first = rank_memories(index, analyse_query("hobbies"), query_vector, NOW, options)
    kept = index._clusters[cluster_count(len(index), 0.0)]
    second = rank_memories(index, analyse_query("hobbies"), query_vector, NOW, options)
    assert index._clusters[cluster_count(len(index), 0.0)] is kept
    assert np.array_equal(first.rows, second.rows)
    other, _ = _case()
    assert other._clusters == {}
