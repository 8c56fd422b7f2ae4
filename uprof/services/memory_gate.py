"""The category gate for free text: memories (and intents) withheld by what they reveal.

An attribute shows one fact under one category; a memory shows a person's words,
which can reveal any category. ``RevealGate`` decides, for one reader, whether a
free-text item may be served (decision 0016). It is withheld when any of these is
withheld for the reader (by policy or by consent):

1. one of its own categories (the event's list, plus the detector's, from the
   projection; ``*`` stands for every category);
2. a category of an attribute or intent that cites the same capture (so what one
   capture revealed in one layer is withheld in every layer, whichever batch or
   proposer recorded it);
3. a category whose attribute *value* the text contains (value-based propagation):
   with ``home_location: Lisbon`` withheld, no text saying "Lisbon" is served,
   whichever capture it came from.

Precision matters less than recall here: a wrongly withheld memory costs one line of
context; a wrongly served one discloses what the policy forbids.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from domain.categories import detect_categories
from domain.values import CATEGORIES

#: Words of a multi-word attribute value too common to withhold text on their own.
_VALUE_STOPWORDS = frozenset(
    """
    a an the and or of in on at to for with from by my our his her their named called
    is are was were be i me we you he she it they this that new old
    monday tuesday wednesday thursday friday saturday sunday january february march april
    may june july august september october november december
    """.split()
)
#: Shortest value or value word that withholds text on its own.
MIN_VALUE_CHARS = 3


def _value_terms(value: str) -> set[str]:
    """The strings whose presence in a text reveals an attribute value.

    The whole value, and each capitalised word of a multi-word value ("dog named
    Luna" also gives "Luna", "Ana Sousa" gives "Ana" and "Sousa"): names are what
    later turns mention on their own.
    """
    value = " ".join(value.split())
    terms = {value} if len(value) >= MIN_VALUE_CHARS else set()
    words = re.findall(r"[\w'-]+", value)
    if len(words) > 1:
        for word in words:
            if (
                word[:1].isupper()
                and len(word) >= MIN_VALUE_CHARS
                and word.casefold() not in _VALUE_STOPWORDS
            ):
                terms.add(word)
    return terms


def _pattern(terms: Iterable[str]) -> re.Pattern[str] | None:
    alternatives = sorted({t.casefold() for t in terms}, key=len, reverse=True)
    if not alternatives:
        return None
    body = "|".join(re.escape(t).replace(r"\ ", r"\s+") for t in alternatives)
    return re.compile(rf"(?<!\w)(?:{body})(?!\w)", re.IGNORECASE)


@dataclass(frozen=True)
class RevealGate:
    """One reader's verdict on free text, built once per (subject view, reader)."""

    #: category -> "" when servable, else why not ("policy" | "consent").
    allowed: Mapping[str, str]
    #: capture id -> categories of the attributes and intents citing it.
    linked: Mapping[str, frozenset[str]]
    #: reason -> pattern of the withheld values (None when nothing is withheld).
    values: Mapping[str, re.Pattern[str] | None]

    @classmethod
    def build(
        cls,
        allowed: Mapping[str, str],
        *,
        items: Iterable[tuple[str, Iterable[str]]],
        values: Iterable[tuple[str, str]],
    ) -> RevealGate:
        """``items``: (category, evidence) of attributes and intents; ``values``:
        (category, value) of attributes, superseded ones included."""
        linked: dict[str, set[str]] = {}
        for category, evidence in items:
            for capture_id in evidence:
                linked.setdefault(capture_id, set()).add(category)
        terms: dict[str, set[str]] = {}
        for category, value in values:
            reason = allowed.get(category, "policy")
            if reason:
                terms.setdefault(reason, set()).update(_value_terms(value))
        return cls(
            allowed=dict(allowed),
            linked={k: frozenset(v) for k, v in linked.items()},
            values={reason: _pattern(t) for reason, t in sorted(terms.items())},
        )

    def reason(
        self,
        categories: Iterable[str],
        evidence: Iterable[str],
        texts: Iterable[str],
        *,
        detect: bool = False,
        link: bool = True,
    ) -> str:
        """Why the item is withheld ("" when it may be served).

        ``detect`` runs the detector over ``texts`` too (for items whose categories
        the projection did not derive, such as intents). ``link`` adds the categories
        of the items citing the same captures: right for a memory, which is the
        capture's words; not for an intent, a phrase drawn from them.
        """
        texts = [t for t in texts if t]
        wanted = set(categories) or {"*"}
        if "*" in wanted:
            wanted = set(CATEGORIES)
        if link:
            for capture_id in evidence:
                wanted |= self.linked.get(capture_id, frozenset())
        if detect:
            for text in texts:
                wanted |= detect_categories(text)
        reasons = {self.allowed.get(c, "policy") for c in wanted} - {""}
        for reason, pattern in self.values.items():
            if pattern is not None and any(pattern.search(t) for t in texts):
                reasons.add(reason)
        if not reasons:
            return ""
        return "policy" if "policy" in reasons else sorted(reasons)[0]

    def hides(self, text: str) -> bool:
        """Whether ``text`` contains a withheld value (e.g. a speaker label)."""
        return any(p is not None and p.search(text) for p in self.values.values())
