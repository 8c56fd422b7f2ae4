"""Which catalogue categories a memory's text reveals: the sensitive-category detector.

A memory is what a person said, kept in their words, so it can reveal anything an
attribute could: "I live in Lisbon" is a ``location`` whatever its proposer called it.
Policy and consent withhold categories, so a memory must carry every category it
reveals (decision 0016). Three sources feed a memory's categories:

1. the category its proposer gave it (``conversation`` for the extractor);
2. the categories of every attribute and intent proposed from the same capture;
3. this detector, over the memory's own text.

The detector is cue lists and patterns per sensitive category. The cue lists are the
catalogue's (``CategorySpec.detector_cues``, domain.catalogue): a category with cues there
is detected, with no code here. Some categories also have patterns no word list can
say (a street address, a phone number, "my sister"), kept here in ``PATTERNS``. It errs towards
tagging: a memory wrongly tagged ``health`` is withheld from an app that may not
read health (the safe side); a health memory tagged only ``conversation`` is served to
it. It does not tag every sentence: each cue is a word or phrase that names the
category's subject matter, never a common function word. It is pure and
deterministic, so the aggregate (when a memory is recorded) and the projector (when
an old event is replayed) reach the same answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from domain.catalogue import CATALOGUE, Catalogue
from domain.lexicon import DEMONYMS, FAMILY_RELATIONS, NAMED_ONLY_RELATIONS

_Cues = tuple[frozenset[str], tuple[str, ...]]


def _cues(raw: str) -> _Cues:
    """Split a comma-separated cue list into single words and padded phrases."""
    items = {" ".join(_tokens(w)) for w in raw.split(",") if w.strip()}
    words = frozenset(w for w in items if " " not in w)
    phrases = tuple(sorted(f" {w} " for w in items if " " in w))
    return words, phrases


_TOKEN_RE = re.compile(r"[a-z0-9]+(?:['-][a-z0-9]+)*")


def _tokens(text: str) -> list[str]:
    return _TOKEN_RE.findall(text.lower().replace("\u2019", "'"))


#: (verbs, what must follow one of them) that state where someone is, was or goes.
_LOCATION_PAIRS: tuple[tuple[frozenset[str], frozenset[str]], ...] = (
    (
        frozenset(
            "live lives living lived reside resides residing resided settled raised born".split()
        ),
        frozenset("in at near on outside around".split()),
    ),
    (frozenset(["based"]), frozenset("in at near out".split())),
    (
        frozenset("move moves moving moved relocate relocates relocating relocated".split()),
        frozenset("to from into out across back".split()),
    ),
    (
        frozenset(
            "fly flying flew travel travelling traveling travelled traveled trip vacation "
            "holiday holidays visit".split()
        ),
        frozenset("to in from".split()),
    ),
)
_LOCATION_NOUNS = frozenset(
    "hometown city town village neighbourhood neighborhood country street apartment flat "
    "house place home address location".split()
)
_FROM_SUBJECTS = frozenset("i'm im we're".split())
_ADDRESS = re.compile(
    r"\b\d{1,5}\s+(?:[A-Za-z]+\s+){1,3}(?:street|st|road|rd|avenue|ave|lane|ln|"
    r"boulevard|blvd|drive|dr|way|court|ct|place|pl|square|sq)\b",
    re.IGNORECASE,
)
_RELATIONS = FAMILY_RELATIONS | NAMED_ONLY_RELATIONS
_POSSESSIVES = frozenset("my our mine his her their".split())
_MONEY = re.compile(
    r"[$€£¥₹]\s?\d|\b\d[\d,.]*\s?(?:k|usd|eur|gbp|dollars|euros|pounds)\b", re.IGNORECASE
)
#: Words after which a demonym or belief describes the speaker ("I'm Dutch", "as a Catholic").
_SELF_MARKERS = frozenset("i'm im am being we're".split())
_CALL_ME_NAME = re.compile(r"\b[Cc]all\s+me\s+[A-Z]")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+")
_HANDLE = re.compile(r"(?<![\w@])@[A-Za-z_][\w.]{2,}")
_CONTACT_NOUNS = frozenset(
    "phone cell mobile number email e-mail address handle instagram twitter whatsapp "
    "telegram signal snapchat tiktok linkedin skype discord".split()
)
#: A run of digits and phone punctuation; a phone number has 9 to 15 digits (E.164).
_PHONE_RUN = re.compile(r"(?<![\w.])\+?\(?\d[\d\s().-]{6,}\d(?!\w)")
#: Dates and ranges of years look like digit runs but are not numbers to call.
_NOT_PHONE = re.compile(
    r"^\d{4}[-./]\d{1,2}[-./]\d{1,2}$|^\d{1,2}[-./]\d{1,2}[-./]\d{2,4}$|^\d{4}\s*-\s*\d{4}$"
)


def _has_phone_number(text: str) -> bool:
    if sum(c.isdigit() for c in text) < 9:
        return False
    for m in _PHONE_RUN.finditer(text):
        run = m.group(0).strip()
        digits = sum(c.isdigit() for c in run)
        if 9 <= digits <= 15 and not _NOT_PHONE.match(run):
            return True
    return False


def _has(cues: _Cues, words: set[str], joined: str) -> bool:
    single, phrases = cues
    return not single.isdisjoint(words) or any(p in joined for p in phrases)


def _followed(tokens: list[str], first: frozenset[str], then: frozenset[str], gap: int) -> bool:
    """Whether a token of ``first`` is followed within ``gap`` tokens by one of ``then``."""
    for i, token in enumerate(tokens):
        if token in first and not then.isdisjoint(tokens[i + 1 : i + 1 + gap]):
            return True
    return False


@dataclass(slots=True)
class _Text:
    """A text as every check reads it: its tokens, their set, and both joined and raw."""

    tokens: list[str]
    words: set[str]
    joined: str  # the tokens joined by single spaces, padded with one at each end
    raw: str


def _location(t: _Text) -> bool:
    for verbs, after in _LOCATION_PAIRS:
        if not verbs.isdisjoint(t.words) and _followed(t.tokens, verbs, after, 2):
            return True
    if _followed(t.tokens, _POSSESSIVES, _LOCATION_NOUNS, 2):
        return True
    if "from" in t.words and (
        _followed(t.tokens, _FROM_SUBJECTS, frozenset(["from"]), 2)
        or " i am from " in t.joined
        or " i am originally from " in t.joined
        or any(
            f" {s} {v} from " in t.joined
            for s in ("i", "we", "family")
            for v in ("come", "came", "comes")
        )
    ):
        return True
    return any(c.isdigit() for c in t.raw) and _ADDRESS.search(t.raw) is not None


def _family(t: _Text) -> bool:
    return not _RELATIONS.isdisjoint(t.words) and _followed(t.tokens, _POSSESSIVES, _RELATIONS, 3)


def _finance(t: _Text) -> bool:
    return any(c.isdigit() for c in t.raw) and _MONEY.search(t.raw) is not None


def _identity(t: _Text) -> bool:
    if _CALL_ME_NAME.search(t.raw):
        return True
    if DEMONYMS.isdisjoint(t.words):
        return False
    if _followed(t.tokens, _SELF_MARKERS, DEMONYMS, 3):
        return True
    return any(f" as {a} {d} " in t.joined for a in ("a", "an") for d in DEMONYMS & t.words)


def _contact(t: _Text) -> bool:
    if "@" in t.raw and (_EMAIL.search(t.raw) or _HANDLE.search(t.raw)):
        return True
    if not _CONTACT_NOUNS.isdisjoint(t.words) and _followed(
        t.tokens, frozenset(["my", "our"]), _CONTACT_NOUNS, 1
    ):
        return True
    return _has_phone_number(t.raw)


#: Patterns beyond the catalogue's cue words, per category: a category is detected when
#: its cues or its pattern match. A category the catalogue gives no cues is not detected.
PATTERNS: dict[str, Callable[[_Text], bool]] = {
    "location": _location,
    "family": _family,
    "finance": _finance,
    "identity": _identity,
    "contact": _contact,
}

#: Longest text the detector reads; memories are short, a pasted document is cut here.
MAX_DETECTED_CHARS = 20_000


class CategoryDetector:
    """The detector for one catalogue: its sensitive categories' cues, plus ``patterns``."""

    def __init__(
        self,
        catalogue: Catalogue,
        patterns: dict[str, Callable[[_Text], bool]] | None = None,
    ) -> None:
        patterns = PATTERNS if patterns is None else patterns
        sensitive = [spec for spec in catalogue.specs if spec.sensitive]
        stray = sorted(set(patterns) - {spec.name for spec in sensitive})
        if stray:
            raise ValueError(
                f"patterns: {', '.join(stray)} not a category with detector_cues in the catalogue"
            )
        self._checks: tuple[tuple[str, _Cues, Callable[[_Text], bool] | None], ...] = tuple(
            (spec.name, _cues(spec.detector_cues), patterns.get(spec.name)) for spec in sensitive
        )
        #: The categories this detector looks for, in catalogue order.
        self.categories: tuple[str, ...] = tuple(name for name, _, _ in self._checks)

    def __call__(self, text: str) -> frozenset[str]:
        """Return the sensitive categories the text reveals (possibly none)."""
        if not text:
            return frozenset()
        window = text[:MAX_DETECTED_CHARS].replace("\u2019", "'")
        tokens = _tokens(window)
        words = set(tokens)
        joined = f" {' '.join(tokens)} "
        found = set()
        read = _Text(tokens, words, joined, window)
        for name, cues, pattern in self._checks:
            if _has(cues, words, joined) or (pattern is not None and pattern(read)):
                found.add(name)
        return frozenset(found)


_DETECTOR = CategoryDetector(CATALOGUE)
#: The categories the detector looks for (all in ``domain.values.CATEGORIES``).
DETECTED_CATEGORIES: tuple[str, ...] = _DETECTOR.categories


def detect_categories(text: str) -> frozenset[str]:
    """Return the sensitive categories the text reveals (possibly none)."""
    return _DETECTOR(text)


def memory_categories(
    primary: str, *, revealed: Iterable[str] = (), texts: Iterable[str] = ()
) -> list[str]:
    """Return a memory's categories: its primary one first, then the rest sorted.

    ``revealed`` are the categories known from elsewhere (the proposer's extra
    labels, the attributes and intents of the same capture); ``texts`` are what the
    memory shows (its text, or an experience's fields), run through the detector.
    """
    found = set(revealed)
    for text in texts:
        found |= detect_categories(text)
    found.discard(primary)
    return [primary, *sorted(found)]
