"""What the engine returns: the slice, its items and the report of what was left out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import numpy as np

from audit.entry import MAX_LIST
from domain.values import Layer
from uprof.retrieval.candidates import Candidate

LeftOutReason = Literal["budget", "duplicate", "low_relevance"]


class LeftOut(NamedTuple):
    """One candidate that is not in the slice, and why.

    A NamedTuple rather than a dataclass: a subject with thousands of memories
    reports thousands of these per query, and tuples are several times cheaper
    to build (the index even keeps the common "not retrieved" ones ready-made).
    """

    item_id: str
    layer: Layer
    reason: LeftOutReason
    detail: str = ""


@dataclass(frozen=True)
class PackedSlice:
    """The exact text to inject, the items in it, its cl100k size and the left-out report."""

    text: str
    items: tuple[Candidate, ...]
    n_tokens: int
    #: Candidates that were ranked and not taken (budget, duplicate, low relevance),
    #: most actionable first.
    ranked_out: tuple[LeftOut, ...]
    #: The index's ready-made entries for memories outside the retrieved pool, and
    #: which of them apply: thousands per query, so listed only when asked for.
    _all_not_retrieved: tuple[LeftOut, ...] = field(default=(), repr=False)
    _not_retrieved_rows: np.ndarray | None = field(default=None, repr=False)

    @property
    def not_retrieved(self) -> tuple[LeftOut, ...]:
        """Memories never retrieved for the query (all low relevance)."""
        if self._not_retrieved_rows is None:
            return ()
        return tuple(self._all_not_retrieved[i] for i in self._not_retrieved_rows.tolist())

    @property
    def left_out(self) -> tuple[LeftOut, ...]:
        """Every candidate not in the slice, and why."""
        return self.ranked_out + self.not_retrieved


@dataclass(frozen=True)
class SliceOptions:
    """Knobs of ranking and packing. Defaults are sensible generic values, not tuned per dataset.

    Relevance of a memory is a fusion of its lexical (BM25) and dense (cosine)
    scores, each scaled to [0, 1] over the subject's memories, plus small
    recency, heat and speaker terms. It becomes a packing utility in [0, 1]
    (the best memory is 1) that the packer trades against token cost.
    """

    #: Share of the lexical score in the fusion; the dense score gets the rest.
    lexical_weight: float = 0.7
    #: How the lexical and dense signals of a memory are fused: ``"score"`` mixes their
    #: scaled scores linearly; ``"rrf"`` mixes their reciprocal ranks instead (Cormack et
    #: al. 2009), ``(rrf_k + 1) / (rrf_k + rank)`` per signal, weighted by
    #: ``lexical_weight`` as above, so a memory first in both scores 1. Off: it gained
    #: nothing that held on the untouched half (decision 0122-retrieval-round-8).
    fusion: Literal["score", "rrf"] = "score"
    rrf_k: float = 60.0
    #: Pseudo-relevance feedback: the query vector moves towards the mean of the best
    #: ``feedback_memories`` first-pass hits, by ``feedback_weight``. Off: it cost 0.02-0.06
    #: on PrefEval and was neutral on LoCoMo (decision 0033-multi-hop-and-preferences).
    feedback_memories: int = 5
    feedback_weight: float = 0.0
    #: Bonus for memories spoken by a person the query names.
    actor_weight: float = 0.2
    #: Bonus for a profile line whose category the query's words point at ("job" ->
    #: occupation). Off: a bonus its source memory never gets let extracted lines crowd
    #: out memories (decision 0023); 0.2 cost 0.05 on PrefEval and gained nothing on
    #: LoCoMo (decision 0033-multi-hop-and-preferences).
    category_weight: float = 0.0
    #: Bonus for recent memories, halving every ``recency_half_life_days``.
    recency_weight: float = 0.05
    recency_half_life_days: float = 180.0
    #: Bonus for hot memories (MemoryOS heat, scaled by the subject's hottest memory).
    heat_weight: float = 0.05
    #: Share of the better adjacent turn's relevance added to a memory's own
    #: (a question and its answer are often split over two adjacent turns).
    neighbour_weight: float = 0.3
    #: Semantic bridges: the ``bridge_seeds`` best memories each lend up to this share of
    #: their relevance to the memories closest to them in meaning (0 turns it off). A
    #: bridged memory is worth at most half its seed, the same discount MMR gives a
    #: near-repeat of a chosen item.
    bridge_weight: float = 0.5
    bridge_seeds: int = 10
    #: Utilities are relevance ** sharpness: higher values follow the ranking more strictly.
    sharpness: float = 3.0
    #: Memories considered for packing (the best by relevance, plus their neighbours).
    pool_size: int = 200
    #: Marginal-relevance penalty: gain = utility * (1 - mmr_penalty * max similarity to chosen).
    mmr_penalty: float = 0.5
    #: Similarity at or above which a candidate is a near-duplicate of a chosen item.
    duplicate_threshold: float = 0.95
    #: Candidates whose utility falls below this are left out as low relevance.
    min_utility: float = 0.01
    #: Memories grouped under one date line per day (False: a date on every line).
    group_memories_by_day: bool = True
    #: A profile line and the memory it was extracted from count as duplicates.
    derived_duplicates: bool = True
    #: Most items one slice holds: its read is audited item by item, and one audit entry
    #: lists at most this many (a slice the log could not record would not be served).
    max_items: int = MAX_LIST
    #: The legend line is shown only when some item carries a mark it explains.
    legend_only_when_marked: bool = True
    #: Utility of attributes that neither match the query's categories nor its words.
    attribute_base_utility: float = 0.15
    #: Utility of active intents that the query does not touch.
    intent_base_utility: float = 0.2
