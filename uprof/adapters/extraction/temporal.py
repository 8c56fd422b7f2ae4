"""Deadlines from English time phrases, relative to when the user spoke.

``find_deadline("run a marathon by June", at)`` returns the instant after which
the plan has lapsed (the start of the day after the period it names) and where
the phrase sits, so the caller can drop it from the description. Only phrases
with one clear reading are understood; anything vague ("soon", "this summer")
yields no deadline rather than a guess. Deadlines are computed in the time zone
of the reference instant and are always later than it.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from uprof.adapters.extraction.lexicon import NUMBER_WORDS

_MONTHS: dict[str, int] = (
    {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
    | {abbr.lower(): i for i, abbr in enumerate(calendar.month_abbr) if abbr}
    | {"sept": 9}
)
_WEEKDAYS: dict[str, int] = {name.lower(): i for i, name in enumerate(calendar.day_name)}

_NUM = (
    r"\d{1,3}|a|an|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|"
    r"couple\s+of|a\s+couple\s+of"
)
_MONTH = "|".join(sorted(_MONTHS, key=len, reverse=True))
_WEEKDAY = "|".join(_WEEKDAYS)

_DEADLINE_RE = re.compile(
    rf"""
    \b(?P<dat>(?:the\s+)?day\s+after\s+tomorrow)
  | \b(?:(?:by|before|until)\s+)?(?P<tom>tomorrow)\b(?:\s+(?:morning|afternoon|evening|night))?
  | \b(?:(?:by|before|until|later)\s+)?(?P<tod>today|tonight|this\s+(?:morning|afternoon|evening))\b
  | \b(?:(?P<prep>by|before|until|till|in|during|within|over)\s+)?
    (?:(?P<endof>(?:the\s+)?end\s+of)\s+)?
    (?P<rel>this\s+coming|this|next|the)\s+(?P<unit>week|weekend|month|year)\b
  | \b(?:in|within)\s+(?P<n>{_NUM})\s+(?P<nunit>day|week|month|year)s?\b
  | \b(?:(?P<wprep>on|by|before|until|this\s+coming|this|next|coming)\s+)?
    (?P<wd>{_WEEKDAY})\b(?!s)
  | \b(?:(?P<mprep>by|before|until|till|in|during|this|next|(?:the\s+)?end\s+of)\s+)?
    (?P<mon>{_MONTH})\b\.?(?:\s+(?P<mday>\d{{1,2}})(?:st|nd|rd|th)?\b)?(?:,?\s+(?P<myear>20\d{{2}})\b)?
  | \b(?:(?P<dprep>by|before|until|till|on)\s+)?(?P<dday>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?
    (?P<dmon>{_MONTH})\b(?:,?\s+(?P<dyear>20\d{{2}})\b)?
  | \b(?P<yprep>by|before|until|till|in|during)\s+(?P<year>20\d{{2}})\b
    """,
    re.IGNORECASE | re.VERBOSE,
)

#: Time words that mean "some time" and give no deadline; dropped from descriptions.
VAGUE_TIME_RE = re.compile(
    r"\s*\b(?:someday|some\s+day|one\s+day|eventually|soon|sometime|some\s+time|"
    r"at\s+some\s+point|in\s+the\s+(?:near\s+)?future|later\s+on|later|asap|"
    r"as\s+soon\s+as\s+possible|right\s+away|again|this\s+summer|this\s+winter|"
    r"this\s+spring|this\s+fall|this\s+autumn|next\s+summer|next\s+winter|next\s+spring|"
    r"next\s+fall|next\s+autumn)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Deadline:
    """A deadline found in text: the instant it lapses and the span of its phrase."""

    expires_at: datetime
    start: int
    end: int


def find_deadline(text: str, ref: datetime) -> Deadline | None:
    """Return the first time phrase in text that names a clear future deadline.

    A deadline past the end of the calendar (a capture dated in year 9999 saying "next
    week") is no deadline: raised, it failed the capture's extraction on every attempt,
    and the pipeline stood still behind it for every subject.
    """
    for m in _DEADLINE_RE.finditer(text):
        if _preceded_by_every(text, m.start()):
            continue  # "every Friday" is a routine, not a deadline
        try:
            day = _resolve(m, ref)
        except (OverflowError, ValueError):
            continue  # the date it names is past the calendar's last day
        if day is None:
            continue
        expires = datetime.combine(day, time(0), tzinfo=ref.tzinfo)
        if expires > ref:
            return Deadline(expires, m.start(), m.end())
    return None


def _preceded_by_every(text: str, pos: int) -> bool:
    return text[max(0, pos - 6) : pos].lower().rstrip().endswith(("every", "each"))


def _resolve(m: re.Match[str], ref: datetime) -> date | None:
    """The first day on which the plan no longer holds, or None."""
    today = ref.date()
    g = m.groupdict()
    if g["dat"]:
        return today + timedelta(days=3)
    if g["tom"]:
        return today + timedelta(days=2)
    if g["tod"]:
        return today + timedelta(days=1)
    if g["unit"]:
        return _relative_period(g["rel"], g["unit"], today, bool(g["endof"]), g["prep"])
    if g["nunit"]:
        return _offset(_count(g["n"]), g["nunit"].lower(), today)
    if g["wd"]:
        return _weekday(g["wd"], g["wprep"], m.group("wd"), today)
    if g["mon"]:
        return _month(g["mon"], g["mday"], g["myear"], g["mprep"], today)
    if g["dmon"]:
        return _month(g["dmon"], g["dday"], g["dyear"], g["dprep"] or "on", today)
    if g["year"]:
        year = int(g["year"])
        return date(year, 1, 1) if g["yprep"].lower() == "before" else date(year + 1, 1, 1)
    return None


def _relative_period(
    rel: str, unit: str, today: date, end_of: bool, prep: str | None
) -> date | None:
    """ "this week", "next month", "the end of the year": the day after the period ends."""
    rel = " ".join(rel.lower().split())
    unit = unit.lower()
    if rel == "the" and not end_of:
        return None  # "the week" alone refers back to something said before
    ahead = 1 if rel == "next" else 0
    if unit in {"week", "weekend"}:
        monday = today - timedelta(days=today.weekday())
        return monday + timedelta(weeks=1 + ahead)
    if unit == "month":
        return _add_months(today.replace(day=1), 1 + ahead)
    return date(today.year + 1 + ahead, 1, 1)


def _count(raw: str) -> int:
    raw = " ".join(raw.lower().split())
    if raw.isdigit():
        return int(raw)
    if "couple" in raw:
        return 2
    return NUMBER_WORDS.get(raw, 0)


def _offset(n: int, unit: str, today: date) -> date | None:
    """ "in three weeks": the day after the date that far ahead."""
    if n <= 0:
        return None
    if unit == "day":
        target = today + timedelta(days=n)
    elif unit == "week":
        target = today + timedelta(weeks=n)
    elif unit == "month":
        target = _add_months(today, n)
    else:
        target = _add_months(today, 12 * n)
    return target + timedelta(days=1)


def _weekday(name: str, prep: str | None, raw: str, today: date) -> date | None:
    """ "on Friday", "next Friday": the day after that Friday.

    A weekday always means a future one. "next Friday" is read as the Friday of
    next week, the later of its two common readings, so that a plan never
    lapses before the user meant it to.
    """
    if not prep and not raw[:1].isupper():
        return None  # a bare lower-case "friday" is too weak a cue
    target_wd = _WEEKDAYS[name.lower()]
    days = (target_wd - today.weekday()) % 7 or 7
    target = today + timedelta(days=days)
    if prep and prep.lower() == "next":
        next_monday = today - timedelta(days=today.weekday()) + timedelta(weeks=1)
        if target < next_monday:
            target += timedelta(weeks=1)
    if prep and prep.lower() in {"before", "until"}:
        return target
    return target + timedelta(days=1)


def _month(
    name: str, day_raw: str | None, year_raw: str | None, prep: str | None, today: date
) -> date | None:
    """ "by June", "in March 2027", "on 15 June": the day after that date or month."""
    # "may" and "march" are also verbs: a month needs a capital, a preposition or a day.
    if not (name[:1].isupper() or prep or day_raw):
        return None
    if name.lower() == "may" and not (prep or day_raw):
        return None
    month = _MONTHS[name.lower().rstrip(".")]
    before = (prep or "").lower() in {"before", "until", "till"}
    year = int(year_raw) if year_raw else today.year
    if day_raw:
        day = int(day_raw)
        if not 1 <= day <= calendar.monthrange(year, month)[1]:
            return None
        target = date(year, month, day)
        if not year_raw and target < today:
            target = date(year + 1, month, min(day, calendar.monthrange(year + 1, month)[1]))
        return target if before else target + timedelta(days=1)
    if not year_raw and month < today.month:
        year += 1
    first = date(year, month, 1)
    return first if before else _add_months(first, 1)


def _add_months(day: date, months: int) -> date:
    """Add months, clamping the day to the end of a shorter month (Jan 31 -> Feb 28)."""
    index = day.month - 1 + months
    year, month = day.year + index // 12, index % 12 + 1
    return date(year, month, min(day.day, calendar.monthrange(year, month)[1]))
