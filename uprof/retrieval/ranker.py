"""Relevance of each layer's candidates to a query, as packing utilities in [0, 1].

The three layers are served differently (UProf):

* attributes by category match (a small cue lexicon maps query words to the
  catalogue's categories) and by word or embedding overlap with the query;
* memories by hybrid retrieval: BM25 (scaled by the score of a memory that
  matched the whole query) and MiniLM cosine (after one round of
  pseudo-relevance feedback, scaled from the median to the best memory),
  mixed linearly, plus small speaker, recency and heat terms;
  then each memory gains a share of its time-adjacent neighbours' relevance,
  because a question and its answer often sit in two neighbouring turns, and
  the memories closest in meaning to the best hits are lifted towards them
  (semantic bridges: a category in the question, its instances in the turns);
* active intents, which are the user's current context, always keep a base
  utility and gain more when the query touches them.

A utility is what the packer maximises per token. Memories' fused relevance is
divided by the best one and raised to ``sharpness``, so the top memory is worth
1 and weak ones fall off fast: cheap but mediocre turns then cannot crowd out an
expensive but clearly relevant one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from threadpoolctl import threadpool_limits

from domain.catalogue import CATALOGUE, Catalogue
from uprof.retrieval.candidates import Candidate
from uprof.retrieval.index import MemoryIndex, epoch_seconds
from uprof.retrieval.slices import SliceOptions
from uprof.retrieval.text import stem, term_set, terms, words

_SECONDS_PER_DAY = 86_400.0
#: Below this many memories the seeds' cosines are computed in the calling thread alone:
#: handing half to another thread costs more than it saves (decision 0042).
_SPLIT_LINKS_FROM = 4_096
#: One helper thread, shared by every slice of the process: it computes the second half
#: of a large bridges product while the calling thread computes the first.
_links_helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="uprof-links")


def _own_links_helper_after_fork() -> None:
    """A forked child gets a helper of its own (review of 0185, bug OT). The parent's
    executor comes with a record of the parent's thread, which does not run in the
    child, so it never starts one: each half waited there until its caller took it
    back, and stayed queued, cancelled, holding that call's arrays, for the life of the
    child."""
    global _links_helper
    _links_helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="uprof-links")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_own_links_helper_after_fork)
#: numpy's BLAS computes on the calling thread only, in every process that ranks
#: memories (the bridges' product no longer calls it, decision 0185; whatever else in the
#: process does keeps this choice). A product of a slice's size with BLAS's own threads
#: (one per core) cost 8x the one-thread product on a 2-core machine whose other core
#: was busy (11.5 against 1.4 ms at 5k memories; decision 0162-slice-speed): each call
#: waits for a thread the other processes hold. Set once, here, for the process: the
#: limit is process-wide state, so raising and restoring it per call would race between
#: concurrent slices.
_BLAS_ON_ONE_THREAD = threadpool_limits(limits=1, user_api="blas")


def category_cues(catalogue: Catalogue) -> dict[str, frozenset[str]]:
    """Each category's retrieval cue words (``CategorySpec.retrieval_cues``), stemmed like
    queries; categories without cues are left out."""
    return {
        spec.name: frozenset(stem(w) for w in spec.retrieval_cues.split())
        for spec in catalogue.specs
        if spec.retrieval_cues.strip()
    }


#: Words that signal a category of the catalogue (stemmed at import, like queries).
CATEGORY_CUES: dict[str, frozenset[str]] = category_cues(CATALOGUE)


@dataclass(frozen=True)
class Query:
    """A query analysed once for all layers."""

    text: str
    terms: tuple[str, ...]  # stemmed content words, repeats kept
    cues: frozenset[str]  # every stemmed word, stopwords included (for category cues)
    categories: frozenset[str]  # catalogue categories the query points at


def analyse_query(text: str) -> Query:
    """Split the query into content terms and the categories its words point at."""
    cues = frozenset(stem(w) for w in words(text))
    categories = frozenset(cat for cat, cue in CATEGORY_CUES.items() if cue & cues)
    return Query(text=text, terms=tuple(terms(text)), cues=cues, categories=categories)


class PoolSimilarity:
    """Pairwise similarity inside a memory pool, one column at a time (for MMR).

    Only chosen memories ever need a column (a few dozen of a pool of hundreds),
    so columns are computed on demand. Dense mode uses embedding cosines; lexical
    mode the cosine of term sets, read through an inverted list of the pool: the
    pool members sharing a term with member k are gathered term by term and summed
    with one bincount, which costs what those few postings cost, not a pool x pool
    product.
    """

    def __init__(self, index: MemoryIndex, rows: np.ndarray) -> None:
        self._dense = None if index.vectors is None else index.vectors[rows]
        self._size = len(rows)
        if index.vectors is None:
            pool_terms = index.bm25.term_sets[rows]
            self._terms = pool_terms.tocsr()  # row k: member k's terms and weights
            self._postings = pool_terms.tocsc()  # column t: the members holding term t

    @property
    def batched(self) -> bool:
        """True when columns are cheaper fetched many at a time (lexical mode)."""
        return self._dense is None

    def column(self, k: int) -> np.ndarray:
        """Similarity of every pool member to pool member k."""
        if self._dense is not None:
            similarity: np.ndarray = self._dense @ self._dense[k]
            return similarity
        return self.columns(np.asarray([k]))[:, 0]

    def columns(self, ks: np.ndarray) -> np.ndarray:
        """Similarity of every pool member to each of ks, as a (pool, len(ks)) matrix."""
        if self._dense is not None:
            return np.stack([self.column(int(k)) for k in ks], axis=1)
        starts_k, ends_k = self._terms.indptr[ks], self._terms.indptr[ks + 1]
        own_lengths = ends_k - starts_k
        # Every (member of ks, term) pair, then every posting of that term.
        pair_pos = np.repeat(starts_k - (np.cumsum(own_lengths) - own_lengths), own_lengths)
        pair_pos += np.arange(int(own_lengths.sum()))
        terms, weights = self._terms.indices[pair_pos], self._terms.data[pair_pos]
        pair_of = np.repeat(np.arange(len(ks)), own_lengths)
        starts = self._postings.indptr[terms]
        lengths = self._postings.indptr[terms + 1] - starts
        positions = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
        positions += np.arange(int(lengths.sum()))
        members = self._postings.indices[positions]
        cells = members * len(ks) + np.repeat(pair_of, lengths)
        sums = np.bincount(
            cells,
            weights=self._postings.data[positions] * np.repeat(weights, lengths),
            minlength=self._size * len(ks),
        )
        return sums.reshape(self._size, len(ks))


@dataclass(frozen=True)
class MemoryRanking:
    """The memory pool for one query, best first."""

    rows: np.ndarray  # positions in the index
    utility: np.ndarray  # aligned with rows, in (0, 1], descending
    similarity: PoolSimilarity
    #: Relevance of the best memory (utilities are relative to it; 0 when none).
    best: float = 0.0
    #: Lexical share of the fusion used for this query, and the query's dense scale.
    lexical_weight: float = 1.0
    dense_scale: DenseScale | None = None


@dataclass(frozen=True)
class DenseScale:
    """How cosines become [0, 1] scores for one query: the median memory is 0, the best 1.

    The median, not 0, is the floor because MiniLM cosines of unrelated
    sentences sit well above zero; scaling from it makes the dense score
    comparable with BM25 scaled by a whole-query match. Profile lines are
    scored on the same scale, so they compete with memories on equal terms.
    """

    floor: float
    span: float

    @classmethod
    def of(cls, cosines: np.ndarray) -> DenseScale:
        floor = float(np.median(cosines)) if len(cosines) else 0.0
        return cls(floor, float(cosines.max()) - floor if len(cosines) else 0.0)

    def __call__(self, cosines: np.ndarray) -> np.ndarray:
        if self.span <= 1e-9:
            return np.zeros_like(cosines)
        return np.clip((cosines - self.floor) / self.span, 0.0, 1.0)


def _scaled(cosines: np.ndarray) -> np.ndarray:
    return DenseScale.of(cosines)(cosines)


def _cosines(vectors: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Matrix-vector product without BLAS threads.

    For one query against thousands of rows, multi-threaded BLAS gains little
    and, on a small machine whose cores are busy serving other requests, its
    threads wait on each other for milliseconds; einsum's single-threaded loop
    takes a steady fraction of a millisecond.
    """
    product: np.ndarray = np.einsum("ij,j->i", vectors, query.astype(vectors.dtype, copy=False))
    return product


def _dense_scores(
    index: MemoryIndex,
    query_vector: np.ndarray,
    lexical: np.ndarray,
    weight: float,
    options: SliceOptions,
) -> tuple[np.ndarray, DenseScale]:
    """Scaled cosines after one round of pseudo-relevance feedback (Rocchio), and the
    scale of the query's own cosines.

    The query vector is moved towards the mean of the memories that a first
    fused pass ranks best, then every memory is scored again. Questions are
    short and abstract ("what activities does she do?") while memories are
    concrete; the best first hits pull the query towards the concrete wording.
    """
    assert index.vectors is not None
    q = np.asarray(query_vector, dtype=np.float32).reshape(-1)
    cosines = _cosines(index.vectors, q)
    scale = DenseScale.of(cosines)
    dense = scale(cosines)
    k = min(options.feedback_memories, len(index))
    if k <= 0 or options.feedback_weight <= 0:
        return dense, scale
    first = weight * lexical + (1.0 - weight) * dense
    top = np.argpartition(-first, k - 1)[:k]
    moved = q + options.feedback_weight * index.vectors[top].mean(axis=0)
    norm = float(np.linalg.norm(moved))
    return (dense if norm <= 0 else _scaled(_cosines(index.vectors, moved / norm))), scale


def _reciprocal_ranks(
    scores: np.ndarray, k: float, matched: np.ndarray | None = None
) -> np.ndarray:
    """``(k + 1) / (k + rank)`` of each memory in ``scores``' order (rank 1 is the best, so
    it scores 1); memories outside ``matched`` (no query word, for BM25) score 0 rather
    than an arbitrary rank among the ties at zero. Equal scores rank chronologically."""
    order = np.argsort(-scores, kind="stable")
    ranks = np.empty(len(scores), dtype=np.float64)
    ranks[order] = np.arange(1, len(scores) + 1, dtype=np.float64)
    reciprocal: np.ndarray = (k + 1.0) / (k + ranks)
    if matched is not None:
        reciprocal[~matched] = 0.0
    return reciprocal


def _query_actors(index: MemoryIndex, query: Query) -> tuple[np.ndarray, frozenset[str]]:
    """Which speakers the query names (mask over actor ids) and the name terms it used."""
    named = np.zeros(len(index.actor_terms), dtype=bool)
    used: set[str] = set()
    query_terms = set(query.terms)
    for i, name_terms in enumerate(index.actor_terms):
        hit = name_terms & query_terms
        if hit:
            named[i] = True
            used |= hit
    return named, frozenset(used)


def memory_relevance(
    index: MemoryIndex,
    query: Query,
    query_vector: np.ndarray | None,
    now: datetime,
    options: SliceOptions,
) -> tuple[np.ndarray, float, DenseScale | None]:
    """Fused relevance of every memory, before neighbour flow (float32, >= 0).

    Also returns the lexical weight used and the raw query's dense scale, so other
    items can be scored the same way.
    """
    named, name_terms = _query_actors(index, query)
    # A speaker's name in the question says whose turn to look at; as a BM25 word it
    # would instead favour the other speaker's turns that greet them by name.
    lexical_terms = [t for t in query.terms if t not in name_terms]
    lexical = index.bm25_scores(lexical_terms)
    top = float(lexical.max()) if len(lexical) else 0.0
    if top > 0:
        # Scaled by a whole-query match, not by the best memory: when the best memory
        # shares only a word or two with the query, lexical evidence stays weak and the
        # dense score decides (questions often share no words with their answers).
        lexical = np.clip(lexical / index.ideal_bm25(lexical_terms), 0.0, 1.0)
    scale = None
    if index.vectors is not None and query_vector is not None:
        weight = options.lexical_weight if top > 0 else 0.0
        dense, scale = _dense_scores(index, query_vector, lexical, weight, options)
        if options.fusion == "rrf" and top > 0:
            fused = weight * _reciprocal_ranks(lexical, options.rrf_k, lexical > 0)
            fused += (1.0 - weight) * _reciprocal_ranks(dense, options.rrf_k)
        else:
            fused = weight * lexical + (1.0 - weight) * dense
    else:
        weight, fused = 1.0, lexical
    if named.any():
        speaker = (index.actor_of >= 0) & named[np.maximum(index.actor_of, 0)]
        fused = fused + options.actor_weight * speaker
    if options.recency_weight > 0:
        age_days = np.maximum(epoch_seconds(now) - index.timestamps, 0.0) / _SECONDS_PER_DAY
        recency = np.exp2(-age_days / options.recency_half_life_days)
        fused = fused + options.recency_weight * np.nan_to_num(recency, nan=0.0)
    if options.heat_weight > 0:
        fused = fused + options.heat_weight * index.heat
    return np.asarray(fused, dtype=np.float32), weight, scale


def _with_neighbours(index: MemoryIndex, relevance: np.ndarray, weight: float) -> np.ndarray:
    """Add a share of the better time-adjacent neighbour's relevance to each memory.

    Conversation turns lean on their context: an answer ("yes, twice, with my
    kids") is relevant when the question before it is. Scoring a turn with its
    context lifts such pairs together, which multi-hop questions need.
    """
    if weight <= 0 or len(relevance) == 0:
        return relevance
    padded = np.append(relevance, np.float32(0.0))  # index -1 reads the 0 pad
    lifted: np.ndarray = relevance + weight * np.maximum(padded[index.prev], padded[index.next])
    return lifted


def _seed_links(seed_vectors: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Each seed's cosine to every memory, (seeds, memories): one float32 einsum.

    The largest single product of a slice (10 seeds x 20,000 memories x 384). einsum sums
    each cosine alike wherever its row sits, so two equal memory vectors (a turn repeated
    word for word) get the very same cosine and rank chronologically. A BLAS product
    (decision 0162-slice-speed) is faster, but which kernel OpenBLAS picks for which rows
    depends on the CPU: on SkylakeX only its small and one-row kernels split such ties
    (bug KU), on this AMD EPYC its large products did too (decision 0185). Ties that hold
    on one CPU and not another are no guarantee, so the product is einsum's on every CPU.

    For a large index the memories are cut in two: the helper thread computes the second
    half while this thread computes the first (numpy's loops release the GIL). If the
    helper has not started its half when this thread finishes (the other core is busy),
    this thread takes it back and computes it itself, so a busy machine waits for nothing
    it could not have done alone. Each cosine is the same sum either way.
    """
    n = len(vectors)
    links = np.empty((len(seed_vectors), n), dtype=np.float32)
    seeds = np.asarray(seed_vectors, dtype=np.float32)
    if n < _SPLIT_LINKS_FROM:
        _einsum_product(seeds, vectors, links)
        return links
    half = n // 2
    second = _links_helper.submit(_einsum_product, seeds, vectors[half:], links[:, half:])
    _einsum_product(seeds, vectors[:half], links[:, :half])
    if second.cancel():
        _einsum_product(seeds, vectors[half:], links[:, half:])
    else:
        second.result()
    return links


def _einsum_product(seeds: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """``out = seeds . rows^T`` by einsum: each cosine summed alike wherever its row sits."""
    np.einsum("kj,ij->ki", seeds, rows, out=out)


def _with_bridges(index: MemoryIndex, relevance: np.ndarray, options: SliceOptions) -> np.ndarray:
    """Lift the memories closest in meaning to the best first-stage hits (two-stage retrieval).

    The seeds are the ``bridge_seeds`` memories the first stage ranks best. A question
    about a category ("what activities does Melanie do?") finds one instance ("a
    pottery class") by its words and vector, but not the siblings ("we went camping",
    "off to go swimming"): they share neither with the question, only meaning with the
    instance. So each seed links to every memory by cosine, scaled per seed from the
    median memory (0) to its closest other memory (1), a calibration from the seed's own
    similarity distribution rather than a fixed threshold; a memory's bridged relevance
    is its strongest link times that seed's relevance, times ``bridge_weight``. It
    replaces the memory's own relevance only when higher (a maximum, not a sum), so a
    memory the query reaches directly keeps its place and a bridged one never
    outranks the seed it came through.

    Only memories of this index take part, and the index holds only what the reader
    may see: a bridge can reorder gated items, never add one.
    """
    k = min(options.bridge_seeds, len(relevance))
    if options.bridge_weight <= 0 or k < 1 or len(relevance) < 3 or index.vectors is None:
        return relevance
    seeds = np.argpartition(-relevance, k - 1)[:k]
    # (k, n): each seed's cosine to every memory (_seed_links, einsum). Seeds
    # are rows, so each seed's cosines are contiguous for the partition below (the
    # (n, k) layout made it partition strided columns, several times slower).
    links = _seed_links(index.vectors[seeds], index.vectors)
    floor, closest_other = index.seed_spread(seeds, links)
    strength = np.clip(
        (links - floor[:, None]) / np.maximum(closest_other - floor, 1e-9)[:, None], 0.0, 1.0
    )
    strength[np.arange(k), seeds] = 0.0  # a seed does not lend to itself
    lent = (strength * relevance[seeds][:, None]).max(axis=0)
    lifted: np.ndarray = np.maximum(relevance, options.bridge_weight * lent.astype(relevance.dtype))
    return lifted


def rank_memories(
    index: MemoryIndex,
    query: Query,
    query_vector: np.ndarray | None,
    now: datetime,
    options: SliceOptions,
) -> MemoryRanking:
    """Score all memories, keep the best ``pool_size``, and return their utilities."""
    n = len(index)
    if n == 0 or options.pool_size <= 0:
        empty = np.zeros(0, dtype=np.int64)
        return MemoryRanking(empty, np.zeros(0), PoolSimilarity(index, empty))
    fused, weight, scale = memory_relevance(index, query, query_vector, now, options)
    relevance = _with_neighbours(index, fused, options.neighbour_weight)
    relevance = _with_bridges(index, relevance, options)
    size = min(options.pool_size, n)
    rows = np.argpartition(-relevance, size - 1)[:size] if size < n else np.arange(n)
    # Best first; equal relevance falls back to chronological order (rows are chronological).
    rows = rows[np.lexsort((rows, -relevance[rows]))]
    best = float(relevance[rows[0]])
    utility = (relevance[rows] / best) ** options.sharpness if best > 0 else np.zeros(size)
    return MemoryRanking(
        rows,
        np.asarray(utility, dtype=np.float64),
        PoolSimilarity(index, rows),
        best=max(best, 0.0),
        lexical_weight=weight,
        dense_scale=scale,
    )


class _LexicalMatch:
    """Share of the query's idf mass that a text contains, as BM25 weighs a short line.

    A profile line holding each matched query term once scores what BM25 gives an
    average memory matching those terms, over a whole-query match: the memories'
    lexical scale. The query's terms and their idf are looked up once per query, not
    once per profile line.
    """

    def __init__(self, index: MemoryIndex, query: Query) -> None:
        self._wanted = list(dict.fromkeys(query.terms))
        self._ideal = index.ideal_bm25(self._wanted)
        self._idf = {t: index.ideal_bm25([t]) for t in self._wanted}

    def __call__(self, text: str) -> float:
        if self._ideal <= 0:
            return 0.0
        have = term_set(text)
        total = 0.0
        for term in self._wanted:
            if term in have:
                total += self._idf[term]
        return total / self._ideal


def _confidence_factor(candidate: Candidate) -> float:
    """Less confident items are worth less, never nothing (the mark tells the model why)."""
    return 0.5 + 0.5 * min(max(candidate.confidence, 0.0), 1.0)


def rank_profile_items(
    candidates: Sequence[Candidate],
    query: Query,
    vectors: np.ndarray | None,
    query_vector: np.ndarray | None,
    base_utility: float,
    *,
    index: MemoryIndex,
    ranking: MemoryRanking,
    options: SliceOptions,
) -> np.ndarray:
    """Utilities of attributes or intents, on the memories' scale.

    Each line's relevance is fused like a memory's (the same lexical weight, BM25
    idf and dense scale of this query), plus a category bonus when the query's
    words point at the line's category, then divided by the best memory's
    relevance and sharpened the same way: a line earns its tokens only where it
    is as relevant as the memories it displaces. ``base_utility`` is a small
    floor, so core facts still fill an open query's spare room.
    """
    n = len(candidates)
    out = np.zeros(n)
    if n == 0:
        return out
    dense = np.zeros(n)
    weight = ranking.lexical_weight
    if vectors is not None and query_vector is not None:
        cosines = np.asarray(vectors, dtype=np.float32) @ np.asarray(query_vector, dtype=np.float32)
        scale = ranking.dense_scale or DenseScale(0.2, 0.5)  # no memories: cosine 0.2 to 0.7
        dense = scale(cosines).astype(np.float64)
        if ranking.dense_scale is None:
            weight = options.lexical_weight
    best = ranking.best if ranking.best > 0 else 1.0
    lexical = _LexicalMatch(index, query)
    dense_values = dense.tolist()
    for i, candidate in enumerate(candidates):
        relevance = weight * lexical(candidate.text)
        relevance += (1.0 - weight) * dense_values[i]
        if candidate.category in query.categories:
            relevance += options.category_weight
        utility = min(relevance / best, 1.0) ** options.sharpness
        out[i] = max(base_utility, utility) * _confidence_factor(candidate)
    return out
