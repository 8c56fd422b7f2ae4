"""Late interaction: ColBERT-style MaxSim over a sentence embedder's token vectors.

A sentence vector is the mean of a text's token vectors, so one cosine compares two
averages: a preference stated in passing inside a long turn, or a question whose one
telling word ("vegan", "flights") is outweighed by its frame ("recommend", "what
should I"), loses the match in the average. MaxSim keeps the tokens apart: each query
token takes its best match among the memory's tokens, and the score is the mean of
those maxima (Khattab and Zaharia, ColBERT, 2020). It needs one matrix of unit token
vectors per text, from the same model that embeds the sentences.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class TokenEmbedder(Protocol):
    """Unit-length token vectors of texts, from the model that embeds the index."""

    def token_vectors(self, texts: Sequence[str]) -> Sequence[np.ndarray]:
        """Per text, an (m, d) float32 matrix of L2-normalised token vectors (m may be 0)."""
        ...


def maxsim(query_tokens: np.ndarray, documents: Sequence[np.ndarray]) -> np.ndarray:
    """Each document's MaxSim score: the mean over query tokens of the best cosine among
    the document's tokens. A document or query without tokens scores 0."""
    out = np.zeros(len(documents), dtype=np.float64)
    if len(documents) == 0 or len(query_tokens) == 0:
        return out
    lengths = np.asarray([len(d) for d in documents], dtype=np.int64)
    present = np.flatnonzero(lengths > 0)
    if len(present) == 0:
        return out
    stacked = np.concatenate([documents[i] for i in present.tolist()], axis=0)
    cosines = stacked @ np.asarray(query_tokens, dtype=stacked.dtype).T  # (tokens, q)
    starts = np.concatenate(([0], np.cumsum(lengths[present])[:-1]))
    best = np.maximum.reduceat(cosines, starts, axis=0)  # (documents, q)
    out[present] = best.mean(axis=1)
    return out


@dataclass(frozen=True)
class LateScale:
    """MaxSim scores put on the dense scale of one query.

    The ranker scales cosines by two anchors, the median memory (0) and the best (1).
    MaxSim is mapped by the same two anchors taken over the re-scored memories: their
    median MaxSim goes to their median scaled cosine, their best MaxSim to their best
    scaled cosine. When the re-scored memories are the whole index that is exactly the
    ranker's scale (median 0, best 1); when they are the first stage's best, MaxSim only
    reorders them within the span their cosines already held, so memories outside keep
    scores on the same scale. Profile lines are mapped the same way.
    """

    late_floor: float
    late_span: float
    dense_floor: float
    dense_span: float

    @classmethod
    def of(cls, late: np.ndarray, dense: np.ndarray) -> LateScale:
        late_floor = float(np.median(late))
        dense_floor = float(np.median(dense))
        return cls(
            late_floor,
            float(late.max()) - late_floor,
            dense_floor,
            float(dense.max()) - dense_floor,
        )

    def __call__(self, late: np.ndarray, dense: np.ndarray) -> np.ndarray:
        """Scaled MaxSim; where MaxSim cannot tell memories apart, the dense score itself."""
        if self.late_span <= 1e-9 or self.dense_span <= 1e-9:
            return np.asarray(dense, dtype=np.float64)
        relative = (np.asarray(late, dtype=np.float64) - self.late_floor) / self.late_span
        return np.clip(self.dense_floor + relative * self.dense_span, 0.0, 1.0)
