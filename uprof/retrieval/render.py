"""How a slice reads: section headers, item lines, provenance marks, dates.

Every character here is paid for out of the caller's token budget, so the
format is compact by design:

* one legend line says that items are explicit unless marked, so explicit,
  confident items carry no label at all and only the exceptions pay for one
  (``(inferred 0.4)``, ``(confidence 0.6)``, ``(conflicting)``); the legend itself
  is paid only by a slice that shows such an exception, since it explains nothing
  otherwise;
* the layer is said once by its section header, the category once per item;
* memories are grouped under one ``[8 May 2023]`` line per day instead of
  repeating the date on every line (a date costs about 7 tokens), and each line
  keeps its speaker: ``Caroline: <text>``. With grouping off, every memory line
  reads ``[8 May 2023] Caroline: <text>``.

Item text is shown verbatim, whitespace collapsed to single spaces so that one
item is always exactly one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from domain.values import Layer, Provenance
from uprof.retrieval.candidates import Candidate

#: Says once what an unmarked item is: stated by the user, confidence at least CONFIDENT.
LEGEND = "Profile (explicit unless marked):"
SECTION_HEADERS: dict[Layer, str] = {
    Layer.ATTRIBUTE: "Attributes:",
    Layer.INTENT: "Active intents:",
    Layer.MEMORY: "Memories:",  # chronological; the day lines make the order plain
}
#: Sections in the order they are rendered: stable facts, current goals, then history.
SECTION_ORDER: tuple[Layer, ...] = (Layer.ATTRIBUTE, Layer.INTENT, Layer.MEMORY)
#: Explicit items at or above this confidence carry no confidence mark.
CONFIDENT = 0.8
#: Memory categories too common to be worth a label.
PLAIN_MEMORY_CATEGORIES = frozenset({"", "conversation"})
#: Statuses that are the section's default and need no label.
PLAIN_STATUSES = frozenset({"", "active", "current"})
UNDATED = "[undated]"
SUMMARY_WORDS = 12


def one_line(text: str) -> str:
    """Collapse all whitespace (newlines included) to single spaces."""
    return " ".join(text.split())


def format_day(moment: datetime) -> str:
    """``8 May 2023``: unambiguous across locales, and cheap in tokens."""
    return f"{moment.day} {moment:%B %Y}"


def day_header(moment: datetime | None) -> str:
    """The line that opens a day's group of memories."""
    return UNDATED if moment is None else f"[{format_day(moment)}]"


def _format_confidence(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".") if value < 1 else "1"


def provenance_mark(candidate: Candidate, *, show_category: bool) -> str:
    """The compact label an item needs beyond the section defaults ("" when none)."""
    parts: list[str] = []
    if show_category and candidate.category not in PLAIN_MEMORY_CATEGORIES:
        parts.append(candidate.category)
    if candidate.provenance == Provenance.INFERRED:
        parts.append(f"inferred {_format_confidence(candidate.confidence)}")
    elif candidate.provenance == Provenance.REPORTED:
        parts.append(f"reported {_format_confidence(candidate.confidence)}")
    elif candidate.confidence < CONFIDENT:
        parts.append(f"confidence {_format_confidence(candidate.confidence)}")
    if candidate.status not in PLAIN_STATUSES:
        parts.append(candidate.status)
    return f" ({', '.join(parts)})" if parts else ""


def needs_legend(candidate: Candidate) -> bool:
    """True when the item's line carries a provenance or status mark the legend explains."""
    return (
        candidate.provenance != Provenance.EXPLICIT
        or candidate.confidence < CONFIDENT
        or candidate.status not in PLAIN_STATUSES
    )


def memory_line(candidate: Candidate, *, with_date: bool, with_actor: bool = True) -> str:
    """``Caroline: <text>`` (grouped by day) or ``[8 May 2023] Caroline: <text>``.

    ``with_actor`` False drops the speaker label (the index does so when every memory
    has the same speaker: a label that tells no one apart only costs tokens).
    """
    body = one_line(candidate.text)
    if candidate.actor and with_actor:
        body = f"{one_line(candidate.actor)}: {body}".rstrip()
    line = body + provenance_mark(candidate, show_category=True)
    return f"{day_header(candidate.occurred_at)} {line}" if with_date else line


def _labelled(candidate: Candidate, body: str) -> str:
    """``- <category>: <body><mark>``, skipping a category the text already starts with."""
    category = candidate.category
    if category and not body.lower().startswith(category.lower()):
        body = f"{category}: {body}"
    return f"- {body}{provenance_mark(candidate, show_category=False)}"


def attribute_line(candidate: Candidate) -> str:
    """One attribute: ``- diet: vegetarian`` plus a mark when not explicit and confident."""
    return _labelled(candidate, one_line(candidate.text))


def summarise(text: str, max_words: int = SUMMARY_WORDS) -> str:
    """The first sentence, capped at max_words words, with an ellipsis when shortened."""
    flat = one_line(text)
    for stop in (". ", "; ", "! ", "? "):
        cut = flat.find(stop)
        if 0 < cut:
            flat = flat[: cut + 1]
    words = flat.split()
    short = " ".join(words[:max_words])
    return short if short == one_line(text) else short.rstrip(".;!?,") + "…"


def intent_line(candidate: Candidate, *, summary: bool) -> str:
    """One active intent, in full or summarised to its first clause."""
    text = summarise(candidate.text) if summary else one_line(candidate.text)
    return _labelled(candidate, text)


def assemble(lines: Sequence[str]) -> str:
    """Join lines with single newlines: the whole slice is one flat list of lines."""
    return "\n".join(lines)
