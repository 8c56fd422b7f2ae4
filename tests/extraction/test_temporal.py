"""Deadlines from time phrases, relative to a Wednesday afternoon (2025-03-12 15:00 UTC)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.extraction.helpers import TURN_TIME
from uprof.adapters.extraction.temporal import find_deadline

CASES: list[tuple[str, date | None, str]] = [
    # (text, first day on which the plan has lapsed, phrase that was found)
    ("run a marathon by June", date(2025, 7, 1), "by June"),
    ("tomorrow", date(2025, 3, 14), "tomorrow"),
    ("today", date(2025, 3, 13), "today"),
    ("the day after tomorrow", date(2025, 3, 15), "the day after tomorrow"),
    ("this week", date(2025, 3, 17), "this week"),
    ("next week", date(2025, 3, 24), "next week"),
    ("by the end of the month", date(2025, 4, 1), "by the end of the month"),
    ("next month", date(2025, 5, 1), "next month"),
    ("by the end of next year", date(2027, 1, 1), "by the end of next year"),
    ("in two weeks", date(2025, 3, 27), "in two weeks"),
    ("in 3 months", date(2025, 6, 13), "in 3 months"),
    ("on Friday", date(2025, 3, 15), "on Friday"),
    ("next Friday", date(2025, 3, 22), "next Friday"),  # the later reading: next week's
    ("on Wednesday", date(2025, 3, 20), "on Wednesday"),  # today is Wednesday: next one
    ("before Friday", date(2025, 3, 14), "before Friday"),
    ("by 15 June", date(2025, 6, 16), "by 15 June"),
    ("by March 10", date(2026, 3, 11), "by March 10"),  # already past this year
    ("in May", date(2025, 6, 1), "in May"),
    ("in January", date(2026, 2, 1), "in January"),
    ("by 2027", date(2028, 1, 1), "by 2027"),
    ("before 2027", date(2027, 1, 1), "before 2027"),
    ("finish it by 2020", None, ""),  # the past is no deadline
    ("I may go", None, ""),  # "may" the verb
    ("every Friday", None, ""),  # a routine
    ("soon", None, ""),
    ("this summer", None, ""),  # seasons depend on the hemisphere
    ("nearby this week", date(2025, 3, 17), "this week"),
]


@pytest.mark.parametrize(("text", "expected", "phrase"), CASES, ids=[c[0] for c in CASES])
def test_deadline(text: str, expected: date | None, phrase: str) -> None:
    found = find_deadline(text, TURN_TIME)
    if expected is None:
        assert found is None
        return
    assert found is not None
    assert found.expires_at == datetime(expected.year, expected.month, expected.day, tzinfo=UTC)
    assert text[found.start : found.end] == phrase


def test_deadline_keeps_the_turns_time_zone() -> None:
    tz = timezone(timedelta(hours=-5))
    found = find_deadline("tomorrow", datetime(2025, 3, 12, 23, 30, tzinfo=tz))
    assert found is not None
    assert found.expires_at == datetime(2025, 3, 14, tzinfo=tz)


def test_naive_reference_gives_naive_deadline() -> None:
    found = find_deadline("next week", TURN_TIME.replace(tzinfo=None))
    assert found is not None and found.expires_at == datetime(2025, 3, 24)


@given(
    text=st.sampled_from([c[0] for c in CASES]) | st.text(max_size=60),
    ref=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2150, 12, 31)),
)
def test_deadlines_are_always_in_the_future(text: str, ref: datetime) -> None:
    ref = ref.replace(tzinfo=UTC)
    found = find_deadline(text, ref)
    assert found is None or found.expires_at > ref
