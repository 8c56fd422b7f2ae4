"""Helpers shared by the attribute rule modules: numbers, followers, change cues."""

from __future__ import annotations

import re

from uprof.adapters.extraction.lexicon import NUMBER_WORDS
from uprof.adapters.extraction.text import leading_words

NUM = (
    r"(?P<num>\d{1,3}|(?:twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety)"
    r"(?:[\s-](?:one|two|three|four|five|six|seven|eight|nine))?|ten|eleven|twelve|"
    r"thirteen|fourteen|fifteen|sixteen|seventeen|eighteen|nineteen|one|two|three|four|"
    r"five|six|seven|eight|nine)"
)

#: Words that may follow a short statement ("I'm 34 and ...", "I'm vegan btw").
BENIGN_FOLLOWERS = frozenset(
    """
    and but so now today btw though tho lol haha too yet already anyway nowadays
    actually myself these days since for from here by nice as well
    """.split()
)


def parse_number(raw: str) -> int | None:
    """ "34", "thirty-four", "two" -> the integer; anything else -> None."""
    raw = raw.lower().strip()
    if raw.isdigit():
        return int(raw)
    total = 0
    for part in re.split(r"[\s-]+", raw):
        if part not in NUMBER_WORDS:
            return None
        total += NUMBER_WORDS[part]
    return total or None


def follower_ok(rest: str) -> bool:
    """Whether what follows a short statement leaves it complete ("I'm 34." vs "I'm 34 km")."""
    rest = rest.lstrip()
    if not rest or rest[0] in ".,!;:?)":
        return True
    words = leading_words(rest, limit=1)
    return bool(words) and words[0].lower in BENIGN_FOLLOWERS


def states_change(trigger: str) -> bool:
    """ "I'm now a manager", "I now live in Lisbon": the old value no longer holds."""
    return re.search(r"\b(?:now|recently|finally|officially)\b", trigger, re.IGNORECASE) is not None
