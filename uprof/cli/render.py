"""Rich renderings of profiles and evidence for the terminal."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from uprof.facade import ErasureResult, EvidenceView, ProfileView


SHORT_ID = 8


def _short(ids: tuple[str, ...]) -> str:
    return ", ".join(i[:SHORT_ID] for i in ids) if ids else "—"


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if value else "—"


def print_profile(
    console: Console, title: str, view: ProfileView, *, max_memories: int = 12
) -> None:
    stamp = f" as of {_when(view.as_of)}" if view.as_of else ""
    console.rule(f"[bold]{title}[/]{stamp}")

    attributes = Table(title="Attributes", title_justify="left", expand=True)
    for column in ("item", "category", "key", "value", "conf", "status", "label", "evidence"):
        attributes.add_column(column, overflow="fold")
    for a in view.attributes:
        status = a.status
        if a.conflicts_with:
            status += f" ⟷ {_short(a.conflicts_with)}"
        if a.superseded_by:
            status += f" → {a.superseded_by[:SHORT_ID]}"
        attributes.add_row(
            a.item_id[:SHORT_ID],
            a.category,
            a.key,
            a.value,
            f"{a.confidence:.2f}",
            status,
            a.provenance,
            _short(a.evidence),
        )
    console.print(attributes)

    intents = Table(title="Intents", title_justify="left", expand=True)
    for column in ("item", "intent", "status", "conf", "label", "expires", "evidence"):
        intents.add_column(column, overflow="fold")
    for i in view.intents:
        intents.add_row(
            i.item_id[:SHORT_ID],
            i.description,
            i.status,
            f"{i.confidence:.2f}",
            i.provenance,
            _when(i.expires_at),
            _short(i.evidence),
        )
    console.print(intents)

    memories = Table(
        title=f"Memories ({len(view.memories)}, newest {min(max_memories, len(view.memories))})",
        title_justify="left",
        expand=True,
    )
    for column in ("item", "when", "memory", "visits", "label", "sharing", "evidence"):
        memories.add_column(column, overflow="fold")
    for m in view.memories[-max_memories:]:
        memories.add_row(
            m.item_id[:SHORT_ID],
            _when(m.occurred_at),
            m.text,
            str(m.visits),
            m.provenance,
            m.sharing,
            _short(m.evidence),
        )
    console.print(memories)

    consents = Table(title="Consents", title_justify="left", expand=True)
    for column in ("consent", "app", "categories", "purposes", "basis", "granted", "withdrawn"):
        consents.add_column(column, overflow="fold")
    for c in view.consents:
        consents.add_row(
            c.consent_id[:SHORT_ID],
            c.app_id,
            ", ".join(c.categories),
            ", ".join(c.purposes),
            c.legal_basis,
            _when(c.granted_at),
            _when(c.withdrawn_at),
        )
    console.print(consents)


def print_evidence(console: Console, view: EvidenceView) -> None:
    console.rule(f"[bold]{view.layer}[/] {view.item_id}: {view.summary}")
    table = Table(expand=True)
    for column in ("capture", "when", "app", "agent", "session", "source ref", "user said"):
        table.add_column(column, overflow="fold")
    for c in view.captures:
        table.add_row(
            c.capture_id,
            _when(c.occurred_at),
            c.app_id,
            c.agent_id,
            c.session_id,
            c.source_ref or "—",
            c.user_input,
        )
    console.print(table)


def print_receipt(console: Console, result: ErasureResult, out: Path | None) -> None:
    """Print an erasure's signed receipt (or write it to ``out``) and the subject's nonce."""
    if out is not None:
        out.write_text(json.dumps(result.receipt, indent=2) + "\n", encoding="utf-8")
        console.print(f"receipt written to {out}")
    else:
        console.print_json(json.dumps(result.receipt))
    console.print(
        f"[bold]keep this nonce private[/]: it proves the receipt is yours: "
        f"{result.subject_nonce_hex}"
    )
