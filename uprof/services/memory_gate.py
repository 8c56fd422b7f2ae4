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
from dataclasses import dataclass, field

from domain.categories import detect_categories

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
    values: Mapping[str, re.Pattern[str]]
    #: The withheld categories and why; empty when the reader may read everything.
    blocked: Mapping[str, str]
    #: reason -> the casefolded withheld values: a cheap substring test before the regex.
    terms: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

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
        patterns = {reason: _pattern(t) for reason, t in sorted(terms.items())}
        return cls(
            allowed=dict(allowed),
            linked={k: frozenset(v) for k, v in linked.items()},
            values={r: p for r, p in patterns.items() if p is not None},
            blocked={c: r for c, r in allowed.items() if r},
            terms={r: tuple(sorted({v.casefold() for v in t})) for r, t in terms.items() if t},
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
        texts = tuple(texts)
        allowed = self.allowed
        found: set[str] = set()
        for category in categories or ("*",):
            if category == "*":
                found.update(self.blocked.values())
            elif reason := allowed.get(category, "policy"):
                found.add(reason)
        if link and self.blocked:
            for capture_id in evidence:
                for category in self.linked.get(capture_id, ()):
                    if reason := allowed.get(category, "policy"):
                        found.add(reason)
        if detect and self.blocked:
            for text in texts:
                for category in detect_categories(text) if text else ():
                    if reason := allowed.get(category, "policy"):
                        found.add(reason)
        if self.values:
            lowered = [t.casefold() for t in texts if t]
            for reason, pattern in self.values.items():
                if reason not in found and self._mentions(reason, lowered, pattern):
                    found.add(reason)
        if not found:
            return ""
        return "policy" if "policy" in found else sorted(found)[0]

    def _mentions(self, reason: str, lowered: list[str], pattern: re.Pattern[str]) -> bool:
        terms = self.terms.get(reason, ())
        return any(
            any(term in text for term in terms) and pattern.search(text) is not None
            for text in lowered
        )

    def hides(self, text: str) -> bool:
        """Whether ``text`` contains a withheld value (e.g. a speaker label)."""
        lowered = [text.casefold()]
        return any(self._mentions(r, lowered, p) for r, p in self.values.items())
