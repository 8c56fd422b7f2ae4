"""Tiny English verb inflection: enough to turn "running a marathon" into "run a marathon".

The extractor stores intents in base form ("run a marathon") and activities in
gerund form ("running"), whichever way the user phrased them, so that the same
goal said twice reads the same. The rules cover regular verbs; the exception
tables cover the common irregular spellings. A wrong guess only changes the
spelling of a description, never which facts are extracted.
"""

from __future__ import annotations

_VOWELS = frozenset("aeiou")

#: Gerund stems whose base form ends in a silent "e" that "-ing" dropped.
_E_DROPPED: frozenset[str] = frozenset(
    """
    achiev arriv bak becom believ bik car chang chas clos com continu creat danc
    decid declar driv escap exercis explor fac giv hav hik improv includ leav liv los
    mak manag merg mov nam not organiz organis practic prepar produc purchas rac retir
    rid sav scor serv shar shav skat sk slid smil sneez solv stor tak trad typ us vot
    wak writ bor cycl juggl knit
    """.split()
)

#: Short stems ending consonant-vowel-consonant that are already complete words.
_CVC_WORDS: frozenset[str] = frozenset(
    "open edit visit listen order offer cover enter happen travel label limit".split()
)

#: Base forms that "-ing" does not double ("visit" -> "visiting").
_NO_DOUBLE: frozenset[str] = _CVC_WORDS | frozenset("fix box mix wax show play draw".split())

_IRREGULAR_GERUNDS: dict[str, str] = {
    "lie": "lying",
    "die": "dying",
    "tie": "tying",
    "be": "being",
    "see": "seeing",
    "ski": "skiing",
}
_IRREGULAR_BASES: dict[str, str] = {v: k for k, v in _IRREGULAR_GERUNDS.items()}


def is_gerund(word: str) -> bool:
    """Whether word looks like an "-ing" form of a verb ("running", not "ring")."""
    lower = word.lower()
    return len(lower) > 4 and lower.endswith("ing") and any(c in _VOWELS for c in lower[:-3])


def to_base(word: str) -> str:
    """Return the base form of a gerund ("running" -> "run"); other words unchanged."""
    lower = word.lower()
    if lower in _IRREGULAR_BASES:
        return _IRREGULAR_BASES[lower]
    if not is_gerund(lower):
        return word
    stem = lower[:-3]
    if stem in _E_DROPPED:
        return stem + "e"
    # "running" -> "runn" -> "run"; keep genuine doubles such as "fall", "miss", "buzz".
    if (
        len(stem) >= 3
        and stem[-1] == stem[-2]
        and stem[-1] not in "lsz"
        and stem[-1] not in _VOWELS
    ):
        return stem[:-1]
    return stem


def to_gerund(word: str) -> str:
    """Return the "-ing" form of a base verb ("run" -> "running"); gerunds unchanged."""
    lower = word.lower()
    if lower in _IRREGULAR_GERUNDS:
        return _IRREGULAR_GERUNDS[lower]
    if is_gerund(lower):
        return lower
    if lower.endswith("ie"):
        return lower[:-2] + "ying"
    if lower.endswith("e") and not lower.endswith(("ee", "ye", "oe")) and len(lower) > 2:
        return lower[:-1] + "ing"
    if _doubles_final_consonant(lower):
        return lower + lower[-1] + "ing"
    return lower + "ing"


def _doubles_final_consonant(word: str) -> bool:
    """Short consonant-vowel-consonant verbs double their last letter ("swim" -> "swimm")."""
    if word in _NO_DOUBLE or len(word) < 3 or len(word) > 4:
        return False
    a, b, c = word[-3], word[-2], word[-1]
    return a not in _VOWELS and b in _VOWELS and c not in _VOWELS and c not in "wxy"
