"""Text normalisation shared by the write side (de-duplication) and the read side."""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Mapping
from datetime import datetime

_SPACE_RE = re.compile(r"\s+")
_EDGE_PUNCT = " \t\n.,;:!?\"'()[]{}"


def normalise_value(value: str) -> str:
    """Fold a value for equality: NFKC, case-folded, collapsed spaces, no edge punctuation."""
    folded = unicodedata.normalize("NFKC", value).casefold()
    return _SPACE_RE.sub(" ", folded).strip(_EDGE_PUNCT)


def match_described(description: str, candidates: Mapping[str, str]) -> str:
    """The id among ``candidates`` (id -> normalised text) that ``description`` names:
    equal text first, else one containing the other; "" for none. Ties go to the
    smallest id, so every caller matches alike (the aggregate, and the door that
    narrows the candidates to what an agent may see)."""
    norm = normalise_value(description)
    if not norm:
        return ""
    ordered = sorted(candidates.items())
    for item_id, text in ordered:
        if text == norm:
            return item_id
    for item_id, text in ordered:
        if norm in text or text in norm:
            return item_id
    return ""


def decayed(confidence: float, *, since: datetime, now: datetime, half_life_days: float) -> float:
    """Halve a confidence every ``half_life_days`` of silence (never below zero)."""
    days = max(0.0, (now - since).total_seconds() / 86_400.0)
    return confidence * math.pow(0.5, days / half_life_days)


def combine(old: float, new: float) -> float:
    """Noisy-OR: two independent observations raise confidence, never above 1."""
    return 1.0 - (1.0 - old) * (1.0 - new)


def clamp(x: float, low: float = 0.0, high: float = 1.0) -> float:
    if math.isnan(x):
        return low
    return max(low, min(high, x))
