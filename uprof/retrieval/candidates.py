"""The items the retrieval engine chooses from.

A ``Candidate`` is an attribute, memory or intent that already passed the
policy, consent and visibility gate: the engine never decides who may see what,
only which of the visible items are worth their tokens for this query.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from domain.values import Layer, Provenance


@dataclass(frozen=True)
class Candidate:
    """One gated profile item, as it would be shown to a model."""

    item_id: str
    layer: Layer  # attribute | memory | intent
    category: str
    text: str  # the item's content as it would be shown
    confidence: float
    provenance: Provenance  # explicit | inferred
    evidence: tuple[str, ...]  # capture event ids
    source_refs: tuple[str, ...]  # callers' own refs (e.g. "D3:7")
    occurred_at: datetime | None
    actor: str = ""  # who said it (speaker name), may be ""
    heat: float = 0.0  # MemoryOS heat computed by the caller
    status: str = ""  # e.g. "conflicting" for attributes, "active" for intents
