"""Who is speaking in a captured turn, and whose facts its words are.

A turn's ``actor`` names who spoke the user side. In a one-person chat it is empty
or the subject's own name; in a multi-party log (LoCoMo, a group chat) it may be
anybody, and the capture says which actor is the subject with the context key
``subject_actor``. Only the subject's own first-person statements make explicit
attributes about the subject. Another speaker's "I am a nurse" is about that speaker
and proposes nothing; their "you're a nurse" (said to the subject) or "Caroline is a
nurse" (naming the subject) is rewritten into the subject's voice and proposed as
*reported*, at a lower confidence.

With no ``subject_actor`` a named actor is taken to be the subject (one speaker per
subject, as apps that route turns per person send them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from domain.values import Interaction

#: Context key naming the actor who is the subject of the capture's profile.
SUBJECT_ACTOR = "subject_actor"


def _person(name: str) -> str:
    return " ".join(name.casefold().split())


def same_person(a: str, b: str) -> bool:
    """ "Caroline" and "caroline smith" name one person; "Caroline" and "Carol" do not."""
    a, b = _person(a), _person(b)
    return bool(a and b) and (a == b or a.startswith(b + " ") or b.startswith(a + " "))


@dataclass(frozen=True)
class Speaker:
    #: The subject said this turn themselves.
    is_subject: bool
    #: How the subject is named, when known ("" otherwise).
    subject_name: str


def speaker_of(interaction: Interaction) -> Speaker:
    """Whether the subject spoke this turn, and the subject's name when the capture says it."""
    subject_actor = dict(interaction.context).get(SUBJECT_ACTOR, "").strip()
    actor = interaction.actor.strip()
    if actor and subject_actor and not same_person(actor, subject_actor):
        return Speaker(False, subject_actor)
    return Speaker(True, subject_actor or actor)


_FIRST_PERSON = {
    "i'm": "they're",
    "im": "they're",
    "i am": "they are",
    "i've": "they've",
    "i'd": "they'd",
    "i'll": "they'll",
    "i": "they",
    "my": "their",
    "me": "them",
    "mine": "theirs",
    "myself": "themselves",
}
_SECOND_PERSON = {
    "you're": "I'm",
    "youre": "I'm",
    "you are": "I am",
    "you've": "I've",
    "you'd": "I'd",
    "you'll": "I'll",
    "you": "I",
    "your": "my",
    "yours": "mine",
    "yourself": "myself",
}
_PRONOUN_RE = re.compile(
    r"\b(?:i'm|i\s+am|i've|i'd|i'll|im|i|my|me|mine|myself|you're|youre|you\s+are|you've|"
    r"you'd|you'll|you|your|yours|yourself)\b",
    re.IGNORECASE,
)


def in_subject_voice(sentence: str, subject_name: str) -> str | None:
    """Another speaker's sentence rewritten as the subject's own words, or None.

    "You're a nurse" -> "I'm a nurse"; "Caroline is a nurse" -> "I am a nurse" when the
    subject is Caroline; the speaker's own "I" becomes "they", so it states nothing
    about the subject. None when the sentence neither addresses nor names the subject,
    or asks something: a question to the subject states nothing about them.
    """
    if sentence.rstrip().endswith("?"):
        return None
    about_subject = False

    def swap(m: re.Match[str]) -> str:
        nonlocal about_subject
        word = " ".join(m.group().lower().split())
        if word in _SECOND_PERSON:
            about_subject = True
            return _SECOND_PERSON[word]
        return _FIRST_PERSON[word]

    text = _PRONOUN_RE.sub(swap, sentence)
    if subject_name:
        name = r"\s+".join(re.escape(p) for p in subject_name.split())
        named = re.compile(rf"\b{name}(?:(?P<poss>'s)|\s+(?P<verb>(?-i:[a-z]+))\b)?", re.IGNORECASE)

        def by_name(m: re.Match[str]) -> str:
            nonlocal about_subject
            about_subject = True
            if m.group("poss"):
                return "my"
            verb = m.group("verb")
            # "Thanks, Caroline!": a name said to the subject is dropped, not made "I".
            return f"I {_first_person_verb(verb)}" if verb else ""

        text = named.sub(by_name, text)
    return text if about_subject else None


_IRREGULAR_THIRD = {"is": "am", "has": "have", "does": "do", "goes": "go", "was": "was"}


def _first_person_verb(word: str) -> str:
    """ "lives" -> "live", "watches" -> "watch", "is" -> "am"; other words unchanged."""
    lower = word.lower()
    if lower in _IRREGULAR_THIRD:
        return _IRREGULAR_THIRD[lower]
    if len(lower) > 3 and lower.endswith("ies"):
        return lower[:-3] + "y"
    if lower.endswith(("ches", "shes", "sses", "xes")):
        return lower[:-2]
    if len(lower) > 2 and lower.endswith("s") and not lower.endswith(("ss", "us")):
        return lower[:-1]
    return word
