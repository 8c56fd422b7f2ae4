"""Helpers shared by the extraction tests: captures and readable batch summaries."""

from __future__ import annotations

from datetime import UTC, datetime

from domain.values import (
    AttributeProposal,
    CapturedInteraction,
    IntentProposal,
    IntentUpdateProposal,
    Interaction,
    MemoryProposal,
    ProposalBatch,
)

#: A Wednesday afternoon; every relative date in the tests is computed from it.
TURN_TIME = datetime(2025, 3, 12, 15, 0, tzinfo=UTC)


def capture(
    user_input: str,
    *,
    capture_id: str = "cap-0001",
    agent_response: str = "",
    source_ref: str = "",
    occurred_at: datetime = TURN_TIME,
) -> CapturedInteraction:
    """A captured turn from app "app-1" and agent "agent-1"."""
    return CapturedInteraction(
        capture_id=capture_id,
        interaction=Interaction(
            app_id="app-1",
            agent_id="agent-1",
            occurred_at=occurred_at,
            user_input=user_input,
            agent_response=agent_response,
            source_ref=source_ref,
            sharing="shared:coach",
            purpose="personalization",
        ),
    )


def summarise(batch: ProposalBatch) -> set[str]:
    """Every non-memory proposal as a short string, e.g. "home_location=Paris!neg".

    Attributes: ``key=value`` plus ``!neg`` / ``!sup``; intents: ``intent:description``
    plus ``@YYYY-MM-DD`` for a deadline; updates: ``fulfilled:...`` / ``abandoned:...``.
    """
    out: set[str] = set()
    for p in batch.proposals:
        if isinstance(p, AttributeProposal):
            out.add(
                f"{p.key}={p.value}"
                + ("!neg" if p.negated else "")
                + ("!sup" if p.supersedes else "")
            )
        elif isinstance(p, IntentProposal):
            out.add(f"intent:{p.description}" + (f"@{p.expires_at.date()}" if p.expires_at else ""))
        elif isinstance(p, IntentUpdateProposal):
            out.add(f"{p.status.value}:{p.description}")
    return out


def memories(batch: ProposalBatch) -> list[MemoryProposal]:
    return [p for p in batch.proposals if isinstance(p, MemoryProposal)]
