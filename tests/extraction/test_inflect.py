"""Base and gerund forms used to normalise plans and activities."""

from __future__ import annotations

import pytest

from uprof.adapters.extraction.inflect import is_gerund, to_base, to_gerund

PAIRS = [
    ("run", "running"),
    ("swim", "swimming"),
    ("make", "making"),
    ("hike", "hiking"),
    ("learn", "learning"),
    ("read", "reading"),
    ("write", "writing"),
    ("cook", "cooking"),
    ("travel", "traveling"),
    ("visit", "visiting"),
    ("move", "moving"),
    ("use", "using"),
    ("ski", "skiing"),
    ("play", "playing"),
    ("knit", "knitting"),
    ("fall", "falling"),
    ("tell", "telling"),
]


@pytest.mark.parametrize(("base", "gerund"), PAIRS)
def test_round_trip(base: str, gerund: str) -> None:
    assert to_gerund(base) == gerund
    assert to_base(gerund) == base


def test_non_gerunds_are_left_alone() -> None:
    for word in ("ring", "sing", "thing", "spring", "Berlin"):
        assert not is_gerund(word)
        assert to_base(word) == word
