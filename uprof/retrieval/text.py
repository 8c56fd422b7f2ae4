"""Lexical analysis shared by the index (documents) and the ranker (queries).

Both sides must analyse text identically, or BM25 silently stops matching.
Words are Unicode letter/digit runs, lower-cased; the Snowball English stemmer
(Porter2, from PyStemmer) folds inflections and derivations ("painting",
"paints", "painted" -> "paint"; "hobbies", "hobby" -> "hobbi"); function words
and question words are dropped because they match nearly every conversational
turn and carry no topic.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from functools import lru_cache

import Stemmer

_WORD_RE = re.compile(r"[^\W_]+")

#: Function words, auxiliaries, pronouns and question words. Kept small on purpose:
#: BM25's idf already discounts frequent words, this list only removes the words
#: that questions are made of ("what did ... do when ...") and answers are not.
STOPWORDS: frozenset[str] = frozenset(
    """
    a about above after again against all am an and any are as at be because been
    before being below between both but by can could did do does doing down during
    each few for from further had has have having he her here hers herself him himself
    his how i if in into is it its itself just me more most my myself no nor not now of
    off on once only or other our ours ourselves out over own same she should so some
    such than that the their theirs them themselves then there these they this those
    through to too under until up very was we were what when where which while who whom
    why will with would you your yours yourself yourselves s t m d ll re ve don didn
    doesn isn wasn aren weren won wouldn couldn shouldn let lets also ever yes oh hey hi
    hello really got get gets getting go going went gone kind sort thing things like
    much many well may might must shall
    """.split()
)


def normalise(text: str) -> str:
    """NFKC and lower-case: the form every comparison works on."""
    return unicodedata.normalize("NFKC", text).lower()


#: A Snowball stemmer keeps per-call buffers, so it is not safe to share between threads
#: (the API serves reads from a thread pool): one per thread, its own cache off, so the
#: only cache of stemmed words is the one below, which erasure clears.
_THREAD_STEMMERS = threading.local()


def _stemmer() -> Stemmer.Stemmer:
    stemmer = getattr(_THREAD_STEMMERS, "stemmer", None)
    if stemmer is None:
        stemmer = _THREAD_STEMMERS.stemmer = Stemmer.Stemmer("english", 0)
    return stemmer


#: Bounded small on purpose: subjects bring their own words (names, places), so a large
#: bound fills with one-off words and only costs memory (~150 B each); erasure clears it.
@lru_cache(maxsize=8192)
def stem(word: str) -> str:
    """The Snowball (Porter2) English stem of a normalised word; numbers stay as they are."""
    if not word.isalpha():
        return word
    return str(_stemmer().stemWord(word))


def words(text: str) -> list[str]:
    """Normalised word tokens, stopwords included."""
    return _WORD_RE.findall(normalise(text))


def terms(text: str) -> list[str]:
    """Index terms: stemmed content words, in order, duplicates kept (BM25 needs tf)."""
    return [stem(w) for w in words(text) if w not in STOPWORDS]


@lru_cache(maxsize=8192)
def term_set(text: str) -> frozenset[str]:
    """The distinct index terms of a short text, cached: profile lines are matched
    against every query, and their text rarely changes. Keyed by content, so
    erasure clears it (``clear_caches``)."""
    return frozenset(terms(text))


def clear_caches() -> None:
    """Forget every stemmed word and term set (they are keyed by content)."""
    stem.cache_clear()
    term_set.cache_clear()
