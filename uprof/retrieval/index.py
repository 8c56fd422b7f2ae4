"""The per-subject memory index: BM25 postings, the dense matrix and precomputed costs.

Built once from a subject's memory candidates and reused across queries; the
caller caches it per subject and rebuilds it when the subject's projection
moves. Everything a query needs that does not depend on the query is computed
here, so ``build_slice`` only scores, picks and renders:

* a BM25 term-weight matrix (documents x terms, idf and length normalisation
  folded in), so a query's scores are a sum over a few sparse columns;
* the dense matrix of unit-length embeddings (or None: lexical-only mode);
* the rendered line of every memory and its cl100k cost, both layouts (grouped
  under a day line, or with the date on the line), plus day-line costs;
* chronological order, day groups, time-adjacent neighbours, speakers, heat;
* the ready-made "not retrieved" left-out records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import numpy as np

from domain.values import Layer
from uprof.ports import TokenCounter
from uprof.retrieval import render
from uprof.retrieval.candidates import Candidate
from uprof.retrieval.slices import LeftOut
from uprof.retrieval.text import stem, terms

if TYPE_CHECKING:
    import scipy.sparse as sp

#: BM25 (Okapi) constants: the usual defaults, not fitted to any dataset.
BM25_K1 = 1.2
BM25_B = 0.75
#: Memories this close in time count as neighbours (turns of one conversation).
NEIGHBOUR_GAP = timedelta(minutes=30)
NOT_RETRIEVED = "not among the memories most relevant to the query"


def count_all(counter: TokenCounter, texts: Sequence[str]) -> np.ndarray:
    """Token counts of many texts, batched when the counter can batch."""
    batch = getattr(counter, "count_batch", None)
    counts = batch(texts) if callable(batch) else [counter.count(t) for t in texts]
    return np.asarray(counts, dtype=np.int32)


def _as_utc(moment: datetime) -> datetime:
    """Naive datetimes are taken as UTC, never as the machine's local time."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def epoch_seconds(moment: datetime | None) -> float:
    return np.nan if moment is None else _as_utc(moment).timestamp()


def _chronological(candidates: Sequence[Candidate]) -> list[int]:
    """Positions in chronological order; undated first, ties by item id (deterministic)."""

    def key(i: int) -> tuple[int, float, str]:
        moment = candidates[i].occurred_at
        return (
            (0, 0.0, candidates[i].item_id)
            if moment is None
            else (
                1,
                _as_utc(moment).timestamp(),
                candidates[i].item_id,
            )
        )

    return sorted(range(len(candidates)), key=key)


@dataclass(frozen=True)
class _Bm25:
    vocabulary: dict[str, int]
    idf: np.ndarray  # (n_terms,) idf of each indexed term
    unseen_idf: float  # idf of a term no memory contains
    weights: sp.csc_matrix  # (n_docs, n_terms) float32 BM25 term weights
    term_sets: sp.csr_matrix  # (n_docs, n_terms) float32 unit-length binary rows


def _build_bm25(documents: Sequence[list[str]]) -> _Bm25:
    """BM25 weights w[d, t] = idf(t) * tf (k1 + 1) / (tf + k1 (1 - b + b |d| / avgdl))."""
    # Imported here: scipy.sparse is ~0.15 s that a command which builds no index (a CLI
    # capture) would pay at start (decision 0035-observability).
    import scipy.sparse as sp

    vocabulary: dict[str, int] = {}
    rows: list[int] = []
    cols: list[int] = []
    for doc, doc_terms in enumerate(documents):
        for term in doc_terms:
            rows.append(doc)
            cols.append(vocabulary.setdefault(term, len(vocabulary)))
    n_docs, n_terms = len(documents), len(vocabulary)
    ones = np.ones(len(rows), dtype=np.float32)
    tf = sp.csr_matrix((ones, (rows, cols)), shape=(n_docs, n_terms), dtype=np.float32)
    tf.sum_duplicates()
    lengths = np.asarray([len(d) for d in documents], dtype=np.float32)
    avg = float(lengths.mean()) if n_docs and lengths.mean() > 0 else 1.0
    df = np.bincount(tf.indices, minlength=n_terms).astype(np.float32)
    idf = np.log1p((n_docs - df + 0.5) / (df + 0.5)).astype(np.float32)
    norm = BM25_K1 * (1 - BM25_B + BM25_B * lengths / avg)
    row_of = np.repeat(np.arange(n_docs), np.diff(tf.indptr))
    data = tf.data * (BM25_K1 + 1) / (tf.data + norm[row_of]) * idf[tf.indices]
    weights = sp.csr_matrix((data, tf.indices, tf.indptr), shape=tf.shape).tocsc()
    binary = sp.csr_matrix((np.ones_like(tf.data), tf.indices, tf.indptr), shape=tf.shape)
    row_norms = np.sqrt(np.maximum(np.diff(binary.indptr), 1)).astype(np.float32)
    binary.data /= row_norms[row_of]
    unseen = float(np.log1p((n_docs + 0.5) / 0.5))
    return _Bm25(vocabulary, idf, unseen, weights, binary)


def _date_terms(moment: datetime | None) -> list[str]:
    """Index terms of a memory's date: its month name and year ("may", "2023").

    Added as words, not run through the stopword list ("may" is a stopword as a verb),
    so they match a question's "2023" always and its month whenever the month is not a
    stopword of its own.
    """
    if moment is None:
        return []
    moment = _as_utc(moment)
    return [stem(f"{moment:%B}".lower()), str(moment.year)]


def _neighbours(stamps: np.ndarray, actors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Previous and next memory within NEIGHBOUR_GAP in time that replies to it, else -1.

    A reply is a turn by another known speaker: the link exists for a question and
    its answer split over two turns. Two statements in a row by the same speaker
    (or by unknown speakers) are not linked: a stream of unrelated notes captured
    seconds apart would otherwise lend each other relevance.
    """
    n = len(stamps)
    gap = NEIGHBOUR_GAP.total_seconds()
    close = np.abs(np.diff(stamps)) <= gap  # NaN compares False: undated has no neighbours
    close &= (actors[:-1] != actors[1:]) & (actors[:-1] >= 0) & (actors[1:] >= 0)
    prev = np.full(n, -1, dtype=np.int64)
    nxt = np.full(n, -1, dtype=np.int64)
    idx = np.flatnonzero(close)
    prev[idx + 1] = idx
    nxt[idx] = idx + 1
    return prev, nxt


@dataclass(frozen=True, eq=False)
class MemoryIndex:
    """Everything query-independent about one subject's memories (see module docstring).

    Arrays are aligned with ``candidates``, which are in chronological order.
    """

    candidates: tuple[Candidate, ...]
    vectors: np.ndarray | None
    bm25: _Bm25
    lines: tuple[str, ...]  # grouped layout: "Caroline: <text>"
    line_costs: np.ndarray  # tokens of line + its newline
    dated_lines: tuple[str, ...]  # flat layout: "[8 May 2023] Caroline: <text>"
    dated_line_costs: np.ndarray
    day_of: np.ndarray  # day-group id of each memory
    day_headers: tuple[str, ...]  # "[8 May 2023]" per day-group id
    day_header_costs: np.ndarray
    timestamps: np.ndarray  # epoch seconds, NaN when undated
    prev: np.ndarray
    next: np.ndarray
    actor_of: np.ndarray  # index into actor_terms, -1 when no actor
    actor_terms: tuple[frozenset[str], ...]
    heat: np.ndarray  # heat scaled to [0, 1] by the hottest memory
    not_retrieved: tuple[LeftOut, ...]
    marked: np.ndarray  # the line carries a provenance or status mark (needs the legend)
    rows_of_capture: dict[str, tuple[int, ...]]  # capture id -> memories citing it
    #: Bridge seed row -> (median, second-largest) of its cosines to every memory: they
    #: depend on the index only, so each is computed once (at most one per memory).
    _spread: dict[int, tuple[float, float]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(
        cls,
        candidates: Sequence[Candidate],
        vectors: np.ndarray | None,
        counter: TokenCounter,
    ) -> MemoryIndex:
        """Index memory candidates; vectors (float32, one unit row per candidate) may be None."""
        if any(c.layer != Layer.MEMORY for c in candidates):
            raise ValueError("MemoryIndex holds memory candidates only")
        if vectors is not None and vectors.shape[0] != len(candidates):
            raise ValueError("one embedding row per candidate is required")
        order = _chronological(candidates)
        ordered = tuple(candidates[i] for i in order)
        dense = None if vectors is None else _unit_rows(np.asarray(vectors)[order])
        actor_names = sorted({c.actor for c in ordered if c.actor})
        actor_index = {name: i for i, name in enumerate(actor_names)}
        # Only the text is indexed: the speaker is a separate feature (actor_of), so a
        # question naming a speaker can favour that speaker's turns without BM25
        # rewarding every turn that merely addresses them by name.
        # The date is indexed too (month and year as words): a question naming "May
        # 2023" must find that day's turns, whose text never says the date.
        docs = [terms(c.text) + _date_terms(c.occurred_at) for c in ordered]
        speakers = len(actor_names) > 1
        lines = tuple(render.memory_line(c, with_date=False, with_actor=speakers) for c in ordered)
        dated = tuple(render.memory_line(c, with_date=True, with_actor=speakers) for c in ordered)
        days = [c.occurred_at.date() if c.occurred_at is not None else None for c in ordered]
        day_keys = sorted(set(days), key=lambda d: (d is not None, d))
        day_id = {d: i for i, d in enumerate(day_keys)}
        first_of_day = {d: c.occurred_at for c, d in zip(ordered, days, strict=True)}
        headers = tuple(render.day_header(first_of_day[d]) for d in day_keys)
        stamps = np.asarray([epoch_seconds(c.occurred_at) for c in ordered], dtype=np.float64)
        actor_of = np.asarray([actor_index.get(c.actor, -1) for c in ordered], dtype=np.int64)
        prev, nxt = _neighbours(stamps, actor_of)
        heat = np.asarray([max(c.heat, 0.0) for c in ordered], dtype=np.float32)
        if heat.size and heat.max() > 0:
            heat /= heat.max()
        return cls(
            candidates=ordered,
            vectors=dense,
            bm25=_build_bm25(docs),
            lines=lines,
            line_costs=count_all(counter, lines) + 1,
            dated_lines=dated,
            dated_line_costs=count_all(counter, dated) + 1,
            day_of=np.asarray([day_id[d] for d in days], dtype=np.int64),
            day_headers=headers,
            day_header_costs=count_all(counter, headers) + 1,
            timestamps=stamps,
            prev=prev,
            next=nxt,
            actor_of=actor_of,
            actor_terms=tuple(frozenset(terms(name)) for name in actor_names),
            heat=heat,
            not_retrieved=tuple(
                LeftOut(c.item_id, Layer.MEMORY, "low_relevance", NOT_RETRIEVED) for c in ordered
            ),
            marked=np.asarray([render.needs_legend(c) for c in ordered], dtype=bool),
            rows_of_capture=_rows_of_capture(ordered),
        )

    def __len__(self) -> int:
        return len(self.candidates)

    def bm25_scores(self, query_terms: Sequence[str]) -> np.ndarray:
        """BM25 score of every memory for the query terms (repeated terms count again)."""
        weights = self.bm25.weights
        scores = np.zeros(len(self), dtype=np.float32)
        for term in query_terms:
            col = self.bm25.vocabulary.get(term)
            if col is None:
                continue
            lo, hi = weights.indptr[col], weights.indptr[col + 1]
            scores[weights.indices[lo:hi]] += weights.data[lo:hi]
        return scores

    def seed_spread(self, seeds: np.ndarray, links: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each seed's median cosine to the memories and its cosine to its closest other memory.

        ``links`` holds each seed's cosines to every memory, one row per seed. The median is
        the mean of the middle two when n is even (as ``np.median``); the largest cosine is
        the seed itself, so the closest other memory is the second largest. Both depend on
        the index alone, so they are kept per seed: later queries with the same seed skip
        the partition. Returned as float32, the dtype of ``links``.
        """
        n = links.shape[1]
        rows = seeds.tolist()
        missing = [i for i, row in enumerate(rows) if row not in self._spread]
        if missing:
            ranked = np.partition(links[missing], [(n - 1) // 2, n // 2, n - 2], axis=1)
            floors = (ranked[:, (n - 1) // 2] + ranked[:, n // 2]) / 2
            for i, lo, hi in zip(missing, floors.tolist(), ranked[:, n - 2].tolist(), strict=True):
                self._spread[rows[i]] = (lo, hi)
        spread = np.asarray([self._spread[row] for row in rows], dtype=links.dtype)
        return spread[:, 0], spread[:, 1]

    def ideal_bm25(self, query_terms: Sequence[str]) -> float:
        """BM25 of an average-length memory containing each query term once.

        With tf = 1 and |d| = avgdl a term contributes exactly its idf, so this is
        the sum of the query terms' idf (terms no memory contains included). It is
        the score a memory would get for matching the whole query, the natural
        unit for "how well does the best memory match".
        """
        total = 0.0
        for term in query_terms:
            col = self.bm25.vocabulary.get(term)
            total += self.bm25.unseen_idf if col is None else float(self.bm25.idf[col])
        return total


def _rows_of_capture(ordered: Sequence[Candidate]) -> dict[str, tuple[int, ...]]:
    rows: dict[str, list[int]] = {}
    for row, candidate in enumerate(ordered):
        for capture in candidate.evidence:
            rows.setdefault(capture, []).append(row)
    return {capture: tuple(found) for capture, found in rows.items()}


def _unit_rows(matrix: np.ndarray) -> np.ndarray:
    """float32, C-contiguous, rows scaled to unit length (zero rows stay zero)."""
    out = np.array(matrix, dtype=np.float32, copy=True, order="C")
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.divide(out, norms, out=out, where=norms > 0)
    return out
