"""Small builders for retrieval tests: candidates with sensible defaults."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from domain.values import Layer, Provenance
from uprof.retrieval import Candidate

T0 = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
NOW = datetime(2024, 1, 1, tzinfo=UTC)


def memory(
    item_id: str,
    text: str,
    *,
    at: datetime | None = T0,
    actor: str = "Caroline",
    confidence: float = 1.0,
    provenance: Provenance = Provenance.EXPLICIT,
    category: str = "conversation",
    heat: float = 0.0,
) -> Candidate:
    return Candidate(
        item_id=item_id,
        layer=Layer.MEMORY,
        category=category,
        text=text,
        confidence=confidence,
        provenance=provenance,
        evidence=(f"ev-{item_id}",),
        source_refs=(f"ref-{item_id}",),
        occurred_at=at,
        actor=actor,
        heat=heat,
    )


def attribute(
    item_id: str,
    category: str,
    text: str,
    *,
    confidence: float = 0.9,
    provenance: Provenance = Provenance.EXPLICIT,
    status: str = "current",
) -> Candidate:
    return Candidate(
        item_id=item_id,
        layer=Layer.ATTRIBUTE,
        category=category,
        text=text,
        confidence=confidence,
        provenance=provenance,
        evidence=(f"ev-{item_id}",) if provenance == Provenance.EXPLICIT else (),
        source_refs=(),
        occurred_at=None,
        status=status,
    )


def intent(item_id: str, text: str, *, status: str = "active", category: str = "goal") -> Candidate:
    return Candidate(
        item_id=item_id,
        layer=Layer.INTENT,
        category=category,
        text=text,
        confidence=0.9,
        provenance=Provenance.EXPLICIT,
        evidence=(f"ev-{item_id}",),
        source_refs=(),
        occurred_at=None,
        status=status,
    )


def conversation(turns: list[tuple[str, str]], start: datetime = T0) -> list[Candidate]:
    """Memories for consecutive turns of one session, one second apart."""
    return [
        memory(f"m{i}", text, at=start + timedelta(seconds=i), actor=actor)
        for i, (actor, text) in enumerate(turns)
    ]
