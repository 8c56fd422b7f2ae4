"""Text plumbing for the rule-based extractor: splitting, clause cutting, phrase taking.

Every function here is pure and works on one user turn at a time. Regexes are
compiled once at import, because extraction runs on every captured event.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from uprof.adapters.extraction.lexicon import NOT_NAMES

# --- Normalisation -----------------------------------------------------------------

_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "`": "'", "\u00b4": "'"})
_QUOTES = str.maketrans({"\u201c": '"', "\u201d": '"'})
_SPACE_RE = re.compile(r"[ \t\r\f\v\u00a0]+")
_NEWLINES_RE = re.compile(r"\s*\n\s*")


def normalise(text: str) -> str:
    """Unify apostrophes and quotes and collapse runs of spaces; keep line breaks."""
    text = text.translate(_APOSTROPHES).translate(_QUOTES)
    text = _SPACE_RE.sub(" ", text)
    return _NEWLINES_RE.sub("\n", text).strip()


# --- Sentences -----------------------------------------------------------------------

# Split after ., ! or ? followed by space, but not after common abbreviations
# ("Dr.", "St. Louis"): each look-behind is fixed width, as `re` requires.
_SENTENCE_SPLIT_RE = re.compile(
    r"(?<!\bdr\.)(?<!\bst\.)(?<!\bmr\.)(?<!\bms\.)(?<!\bmt\.)(?<!\bjr\.)(?<!\bsr\.)"
    r"(?<!\bmrs\.)(?<!\bvs\.)(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\bft\.)"
    r"(?<=[.!?])\s+|\n+|;\s*",
    re.IGNORECASE,
)


def split_sentences(text: str) -> list[str]:
    """Split a normalised turn into sentences; empty pieces are dropped."""
    return [s for s in (p.strip() for p in _SENTENCE_SPLIT_RE.split(text)) if s]


# "I used to live in Paris but moved to Lisbon": the second clause has no subject.
# When the last subject before the conjunction is "I", the rules get it back.
_ELLIPSIS_RE = re.compile(
    r"(,?\s+(?:but|and|so|yet)\s+)"
    r"((?:now|also|then|later|recently|just|still|currently|really|actually|eventually|"
    r"finally)\s+)*"
    r"(?=(?:live|lived|moved|relocated|work|worked|speak|love|like|enjoy|hate|dislike|"
    r"have|had|want|plan|hope|need|am|grew|went|started|finished|completed|gave|"
    r"decided|turned)\b)",
    re.IGNORECASE,
)
_SUBJECT_RE = re.compile(
    r"\b(?:I(?:'m|'ve|'d|'ll)?|he|she|they|we|you|it|this|that|there)\b"
    r"|\b(?:my|his|her|their|our|your)\s+[\w'-]+",
    re.IGNORECASE,
)


# "I am vegetarian and allergic to peanuts": the second predicate has no "I am".
_PREDICATE_ELLIPSIS_RE = re.compile(
    r"(,?\s+(?:and|but)\s+)((?:also|now|still|currently|originally|severely|very)\s+)*"
    r"(?=(?:allergic|an?|married|single|divorced|engaged|from|fluent|retired|based|vegan|"
    r"vegetarian|pescatarian|lactose|gluten|into|a\s+fan|fond|passionate|afraid|scared)\b)",
    re.IGNORECASE,
)
_LAST_I_AM_RE = re.compile(r"\bI(?:'m|\s+am|m)\b", re.IGNORECASE)


def restore_elided_subject(sentence: str) -> str:
    """Insert "I" after "and"/"but" when the clause continues the user's own statement,
    and "I'm" when it continues an "I am ..." with a second predicate."""
    sentence = _restore_elided_predicate(sentence)
    if not _ELLIPSIS_RE.search(sentence):
        return sentence
    pieces: list[str] = []
    last = 0
    for m in _ELLIPSIS_RE.finditer(sentence):
        subjects = _SUBJECT_RE.findall(sentence, max(0, m.start() - 200), m.start())
        pieces.append(sentence[last : m.end(1)])
        if subjects and subjects[-1].lower() in {"i", "i'm", "i've", "i'd", "i'll"}:
            pieces.append("I ")
        last = m.end(1)
    pieces.append(sentence[last:])
    return "".join(pieces)


def _restore_elided_predicate(sentence: str) -> str:
    if not _PREDICATE_ELLIPSIS_RE.search(sentence):
        return sentence
    pieces: list[str] = []
    last = 0
    for m in _PREDICATE_ELLIPSIS_RE.finditer(sentence):
        window = max(0, m.start() - 200)
        subjects = list(_SUBJECT_RE.finditer(sentence, window, m.start()))
        i_am = list(_LAST_I_AM_RE.finditer(sentence, window, m.start()))
        pieces.append(sentence[last : m.end(1)])
        # Only when the latest subject is the user's "I am" (not "my sister is ... and",
        # not "I am a teacher and I like cats and a dog").
        if subjects and i_am and subjects[-1].start() == i_am[-1].start():
            pieces.append("I'm ")
        last = m.end(1)
    pieces.append(sentence[last:])
    return "".join(pieces)


# --- Clauses ------------------------------------------------------------------------

#: Where a value stops: punctuation, or a conjunction that opens a new clause.
CLAUSE_CUT_RE = re.compile(
    r"\s*(?:[,;:!?()\[\]\"]|\.(?:\s|$)|\s-\s|\s--\s|\u2014)"
    r"|\s+(?:but|because|since|so|though|although|while|whereas|unless|if|cause|cuz|"
    r"coz|except|lol|haha|btw|which|who|whom|whose|where|when|whenever|until|till)\b"
    r"|\s+(?:and|or|then)\s+(?:I|i|I'm|i'm|im|my|we|he|she|they|it|then|now|also|"
    r"you|that|this|still)\b",
    re.IGNORECASE,
)

#: A prefix that makes what follows hypothetical or somebody else's claim.
_HYPOTHETICAL_RE = re.compile(
    r"\b(?:if|whether|unless|suppose|supposing|imagine|pretend|pretending|wish|wished|hope|hoping|"
    r"says|said|thinks|thought|believes|believed|claims|claimed|assumes|assumed|"
    r"told\s+\w+|as\s+though|as\s+if|what\s+if|do\s+you\s+think|would\s+you|"
    r"should\s+I|could\s+I|can\s+I|do\s+I|am\s+I|did\s+I|would\s+I|hypothetically|"
    r"dreamt|dreamed|joking|kidding)\b",
    re.IGNORECASE,
)
_PREFIX_CLAUSE_RE = re.compile(r"[,;:.!?]|\s(?:and|but|so)\s", re.IGNORECASE)


#: How far back a hypothetical marker can sit; "if" governs its own short clause.
_HYPOTHETICAL_WINDOW = 120


def is_hypothetical(sentence: str, pos: int) -> bool:
    """Whether the statement starting at pos sits inside "if ...", "she thinks ..." etc."""
    start = max(0, pos - _HYPOTHETICAL_WINDOW)
    for m in _PREFIX_CLAUSE_RE.finditer(sentence, start, pos):
        start = m.end()
    return _HYPOTHETICAL_RE.search(sentence, start, pos) is not None


#: Words that make a statement uncertain ("I think I'm allergic to nuts", "maybe vegan").
_HEDGE_RE = re.compile(
    r"\b(?:I\s+think|I\s+guess|I\s+suppose|I\s+believe|I'm\s+not\s+sure|I\s+am\s+not\s+sure|"
    r"not\s+sure|maybe|perhaps|probably|possibly|I\s+might|I\s+may|might\s+be|may\s+be|"
    r"kind\s+of|sort\s+of|kinda|sorta|I\s+reckon|apparently|I'm\s+told|supposedly|"
    r"more\s+or\s+less|I\s+feel\s+like)\b",
    re.IGNORECASE,
)
#: How much a hedge keeps of a statement's confidence.
HEDGE_FACTOR = 0.6


def hedge_factor(sentence: str, pos: int) -> float:
    """HEDGE_FACTOR when the clause holding pos is hedged, else 1.0.

    The clause runs from the last boundary before pos to the next one after it,
    so "I think I'm vegan" and "I'm vegan, I think" are both hedged, while
    "I'm vegan and I think jazz is great" hedges only its second clause.
    """
    start = 0
    for m in _PREFIX_CLAUSE_RE.finditer(sentence, 0, pos):
        start = m.end()
    end_m = _CLAUSE_END_RE.search(sentence, pos)
    end = end_m.start() if end_m else len(sentence)
    # "I'm vegan, I think": a hedge that ends the sentence governs what came before it.
    tail = _TRAILING_HEDGE_RE.match(sentence, end)
    if _HEDGE_RE.search(sentence, start, end) or tail:
        return HEDGE_FACTOR
    return 1.0


_CLAUSE_END_RE = re.compile(r"[;.!?]|,\s+(?:and|but|so)\s|\s(?:and|but|so)\s+I\b", re.IGNORECASE)
_TRAILING_HEDGE_RE = re.compile(
    r",\s*(?:I\s+think|I\s+guess|I\s+suppose|I\s+believe|maybe|probably|perhaps)\s*[.!?]*\s*$",
    re.IGNORECASE,
)


def cut_clause(rest: str) -> str:
    """Return rest up to the first clause boundary."""
    m = CLAUSE_CUT_RE.search(rest)
    return rest[: m.start()] if m else rest


# --- Words and phrases ---------------------------------------------------------------

_WORD_RE = re.compile(r"[^\W_][\w'&.\-]*|&")
_ABBREVIATIONS = frozenset({"st.", "mt.", "ft.", "dr.", "jr.", "sr."})


@dataclass(frozen=True)
class Word:
    """One word of a phrase, with where it sits in the text it came from."""

    text: str
    start: int
    end: int

    @property
    def lower(self) -> str:
        return self.text.lower()

    def is_capitalised(self) -> bool:
        return self.text[:1].isupper()


def leading_words(text: str, limit: int = 12) -> list[Word]:
    """The run of words at the start of text separated only by single spaces.

    Stops at any punctuation between words, so "Berlin, Germany" yields ["Berlin"].
    A trailing full stop is dropped unless the word is an abbreviation or an
    acronym ("St.", "U.S."), because sentences keep their final period.
    """
    words: list[Word] = []
    pos = 0
    n = len(text)
    while len(words) < limit:
        while pos < n and text[pos] == " ":
            pos += 1
        m = _WORD_RE.match(text, pos)
        if m is None or (words and text[words[-1].end : m.start()].strip()):
            break
        word = m.group()
        end = m.end()
        while len(word) > 1 and word[-1] in "-'":
            word, end = word[:-1], end - 1
        if word.endswith(".") and word.lower() not in _ABBREVIATIONS and word.count(".") == 1:
            word, end = word[:-1], end - 1
        if not word:
            break
        words.append(Word(word, m.start(), end))
        pos = m.end()
        if end < m.end():  # we trimmed punctuation: the run of words ends here
            break
    return words


def clean(value: str) -> str:
    """Trim spaces and surrounding punctuation and quotes from a value."""
    return value.strip(" \t\n.,;:!?\"'()[]{}*_~-").strip()


def categorical(value: str) -> str:
    """Lower-case a value but keep proper nouns and acronyms ("Italian food", "PhD")."""
    words = value.split()
    out = []
    for word in words:
        if len(word) > 1 and any(c.isupper() for c in word[1:]) and not word.isupper():
            out.append(word)  # "PhD", "iOS": deliberate mixed case
        elif word.isupper() and len(word) <= 4:
            out.append(word)  # "UX", "NBA": acronyms
        elif word[:1].isupper() and not word.isupper():
            out.append(word)  # proper noun mid-sentence: "Italian", "Radiohead"
        else:
            out.append(word.lower())  # plain words and SHOUTING
    return " ".join(out)


def first_to_lower(value: str) -> str:
    """Lower-case the first word when only its first letter is capitalised ("Run" -> "run")."""
    if not value:
        return value
    head, sep, tail = value.partition(" ")
    if head[:1].isupper() and head[1:].islower() and head != "I":
        head = head.lower()
    return head + sep + tail


# Connectors that may sit inside a proper name: "Rio de Janeiro", "Bank of America".
_NAME_CONNECTORS = frozenset({"of", "de", "del", "da", "la", "le", "upon", "am", "&", "y"})
# Words after "Portland, Oregon" that show the comma joined two parts of one place.
_AFTER_PLACE = frozenset(
    """
    and with but for since now right near where which so because at in on the to
    currently these this these until while though although
    """.split()
)


def take_proper(text: str, *, lowercase_mode: bool, max_words: int = 5) -> tuple[str, int] | None:
    """Take a proper noun phrase (a place or an organisation) from the start of text.

    Returns the phrase as written and where it ends in text, or None. Capitalised
    words and inner connectors are kept; the first lower-case word ends it, which
    is what trims "Berlin with my wife" to "Berlin". A leading lower-case "the" is
    dropped ("the Netherlands" -> "Netherlands"). In ``lowercase_mode`` (the user never
    types capitals) up to three words are kept until a common word, title-cased.
    """
    skip = len(text) - len(text.lstrip())
    body = text[skip:]
    # "the Netherlands" -> "Netherlands", but "The Hague" keeps its capitalised article.
    offset = 4 if body[:4] == "the " else 0
    words = leading_words(body[offset:], limit=max_words + 2)
    if not words:
        return None
    if lowercase_mode:
        found = _take_lowercase_proper(words) if not offset else None
        return (found[0], skip + found[1]) if found else None
    kept: list[Word] = []
    for i, word in enumerate(words):
        if word.is_capitalised() or (word.text[:1].isdigit() and kept):
            kept.append(word)
        elif word.lower in _NAME_CONNECTORS and kept and i + 1 < len(words):
            if not words[i + 1].is_capitalised():
                break
            kept.append(word)
        else:
            break
        if len(kept) >= max_words:
            break
    if not kept or (kept[0].lower in NOT_NAMES and not (kept[0].text == "The" and len(kept) > 1)):
        return None
    end = offset + kept[-1].end
    # "Portland, Oregon": a comma, then one more capitalised run that ends the clause.
    if body.startswith(", ", end) and len(kept) < max_words:
        more = leading_words(body[end + 2 :], limit=4)
        run = _leading_capitalised(more)
        if run:
            following = more[len(run)].lower if len(more) > len(run) else None
            after = body[end + 2 + run[-1].end :].lstrip()
            if following in _AFTER_PLACE or (
                following is None and (not after or after[0] in ".!?,;")
            ):
                end += 2 + run[-1].end
    return body[offset:end], skip + end


def _leading_capitalised(words: list[Word]) -> list[Word]:
    run: list[Word] = []
    for word in words:
        if not word.is_capitalised() or word.lower in NOT_NAMES:
            break
        run.append(word)
    return run


# Words that end a lower-case place name ("i live in berlin with my wife").
_LOWER_STOP = frozenset(
    """
    a an the my your his her our their this that these those and or but with for since
    now currently right near at in on to from by so because which who where when while
    though although as of i im i'm we it is are was were be been not no very really just
    also still too here there city town village country area place apartment flat house
    """.split()
)


#: Common words that also start place names ("new york", "old delhi").
_PLACE_PREFIXES = frozenset({"new", "old"})


def _take_lowercase_proper(words: list[Word]) -> tuple[str, int] | None:
    """Lower-case typist: keep up to three uncommon words ("new york"), title-cased."""
    kept: list[Word] = []
    for word in words[:3]:
        if word.lower in _LOWER_STOP or not word.text.isalpha():
            break
        kept.append(word)
    if not kept or (kept[0].lower in NOT_NAMES and kept[0].lower not in _PLACE_PREFIXES):
        return None
    end = kept[-1].end
    return " ".join(w.text.capitalize() for w in kept), end


def take_name(text: str, *, allow_lower: bool, max_words: int = 3) -> tuple[str, int] | None:
    """Take a person's (or pet's) name from the start of text: capitalised words only.

    With ``allow_lower`` (after "my name is"), a lower-case name is accepted and
    capitalised. Words that are common English ("fine", "tired") are refused.
    """
    words = leading_words(text.lstrip(), limit=max_words + 1)
    skip = len(text) - len(text.lstrip())
    kept: list[Word] = []
    for word in words:
        base = word.text[:-2] if word.lower.endswith("'s") else word.text
        if not base.replace("-", "").replace("'", "").isalpha() or base.lower() in NOT_NAMES:
            break
        if not base[:1].isupper() and not (allow_lower and not kept):
            break
        kept.append(Word(base, word.start, word.start + len(base)))
        if len(kept) >= max_words or base != word.text:
            break
    if not kept:
        return None
    name = " ".join(w.text[:1].upper() + w.text[1:] for w in kept)
    return name, skip + kept[-1].end
