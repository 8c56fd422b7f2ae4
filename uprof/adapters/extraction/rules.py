"""The offline, English, rule-based extractor: the default ``Extractor``.

It reads only the user's side of an interaction (``user_input``): what the agent
said is never evidence of a user trait. When the capture says another actor than
the subject spoke (``speaker.py``), only what that speaker says to or about the
subject is proposed, as reported. Every proposal cites the capture as its
evidence and is marked explicit, because the user said it in the first person.
The turn's own words, minus a leading greeting, become its memories: one per turn,
or, for a turn longer than a memory should be, one per window of whole sentences,
so nothing said is lost to a cut (issue 15: a 600-character cut left a third of a
long-narrative QA set's answers in no stored text).

Usage::

    extractor = RuleBasedExtractor()
    batch = extractor.extract(capture)   # ProposalBatch, author "rules/v1"
"""

from __future__ import annotations

import re

from domain.catalogue import CATALOGUE
from domain.values import (
    CapturedInteraction,
    MemoryProposal,
    Proposal,
    ProposalBatch,
)
from uprof.adapters.extraction.engine import Sentence, Turn, run_rules
from uprof.adapters.extraction.facts import ATTRIBUTE_RULES
from uprof.adapters.extraction.lexicon import EMOTION_WORDS, FILLER_WORDS, LIFE_EVENT_WORDS
from uprof.adapters.extraction.plans import INTENT_RULES
from uprof.adapters.extraction.speaker import in_subject_voice, speaker_of
from uprof.adapters.extraction.text import normalise, restore_elided_subject, split_sentences

AUTHOR = "rules/v1"
#: Rules read at most this much of a turn; a pasted document is not self-description.
MAX_RULE_CHARS = 20_000
#: Longest memory text: a longer turn becomes several memories, each a window of
#: whole sentences up to this size (a sentence longer than that is split at words).
DEFAULT_MEMORY_MAX_CHARS = 600

_RULES = ATTRIBUTE_RULES + INTENT_RULES
#: Every category this extractor's proposals can carry: the categories of the keys its
#: rules read (those with a catalogue example, which tests/extraction checks it reads),
#: ``goal`` for intents and ``conversation`` for memories (the category gate's tests are
#: driven from it).
EMITTED_CATEGORIES: tuple[str, ...] = tuple(
    sorted(
        {category for key, category in CATALOGUE.keys() if key.example is not None}
        | {"goal", "conversation"}
    )
)

_GREETING_RE = re.compile(
    r"^(?:(?:hi|hello|hey|hiya|heya|yo|howdy|greetings|good\s+(?:morning|afternoon|evening|day))"
    r"(?:\s+there)?(?:\s+(?-i:[A-Z])[\w-]*)?\s*[!,.:;\u2014-]+\s*"
    r"|(?:hi|hello|hey)\s+(?=(?-i:[A-Z])))",
    re.IGNORECASE,
)
_TOKEN_RE = re.compile(r"[a-z][a-z']*")
_SENTENCE_END_RE = re.compile(r"[.!?](?=\s)")


class RuleBasedExtractor:
    """Extract attributes, intents, intent updates and a memory from the user's words."""

    name = "rules"
    categories = EMITTED_CATEGORIES

    def __init__(
        self, *, author: str = AUTHOR, memory_max_chars: int = DEFAULT_MEMORY_MAX_CHARS
    ) -> None:
        if memory_max_chars < 40:
            raise ValueError("memory_max_chars must be at least 40")
        self.author = author
        self.memory_max_chars = memory_max_chars

    def extract(self, capture: CapturedInteraction) -> ProposalBatch:
        """Propose what the user said about themselves in this one captured turn."""
        interaction = capture.interaction
        text = normalise(interaction.user_input or "")
        speaker = speaker_of(interaction)
        turn = Turn(
            capture_id=capture.capture_id,
            occurred_at=interaction.occurred_at,
            lowercase_mode=_is_lowercase_typist(text),
            capitals_unreliable=_capitals_unreliable(text),
            reported=not speaker.is_subject,
            subject_name=speaker.subject_name,
        )
        for raw in split_sentences(text[:MAX_RULE_CHARS]):
            sentence = raw
            if not speaker.is_subject:
                # Another speaker: only their words to or about the subject count.
                voiced = in_subject_voice(raw, speaker.subject_name)
                if voiced is None:
                    continue
                sentence = voiced
            sentence = restore_elided_subject(sentence)
            run_rules(Sentence(sentence, sentence.lower(), turn), _RULES)

        proposals: list[Proposal] = [
            *turn.attributes.values(),
            *turn.intents.values(),
            *turn.updates.values(),
        ]
        proposals += self._memories(capture, text, turn)
        return ProposalBatch(
            proposals=tuple(proposals),
            author=self.author,
            owner_agent=interaction.agent_id,
            sharing=interaction.sharing,
            app_id=interaction.app_id,
            purpose=interaction.purpose,
        )

    def _memories(
        self, capture: CapturedInteraction, text: str, turn: Turn
    ) -> list[MemoryProposal]:
        """The user's own words as memories, unless a piece is only a greeting or thanks.

        Every piece cites the capture and carries the caller's source ref, so a slice
        that shows any window of a long turn still points at the turn it came from, and
        its span: where in the turn (whitespace collapsed, greeting removed) it sits.
        """
        body = strip_greeting(" ".join(text.split()))
        interaction = capture.interaction
        out: list[MemoryProposal] = []
        for start, end in segment_spans(body, self.memory_max_chars):
            piece = body[start:end].strip()
            start = body.index(piece, start)
            end = start + len(piece)
            if is_small_talk(piece):
                continue
            out.append(
                MemoryProposal(
                    text=piece,
                    evidence=(capture.capture_id,),
                    category="conversation",
                    importance=importance(piece, found_facts=turn.found_anything()),
                    source_refs=(interaction.source_ref,) if interaction.source_ref else (),
                    occurred_at=interaction.occurred_at,
                    span=(start, end),
                )
            )
        return out


def _is_lowercase_typist(text: str) -> bool:
    """No capital letter anywhere, but some letters: capitals cannot mark names."""
    return not any(c.isupper() for c in text) and any(c.isalpha() for c in text)


def _capitals_unreliable(text: str) -> bool:
    """Title Case or SHOUTING: most words start with a capital, so capitals mark nothing."""
    words = [w for w in text.split() if w[:1].isalpha()]
    if len(words) < 4:
        return False
    capitalised = sum(1 for w in words if w[0].isupper() and w != "I" and not w.startswith("I'"))
    return capitalised / len(words) > 0.6


def strip_greeting(text: str) -> str:
    """Drop up to two leading greetings ("Hi there! Hey Sam, ..."); keep everything else."""
    for _ in range(2):
        m = _GREETING_RE.match(text)
        if m is None or m.end() == 0:
            break
        text = text[m.end() :]
    return text.strip()


def is_small_talk(text: str) -> bool:
    """A turn made only of greetings, thanks and acknowledgements ("ok", "thanks!")."""
    tokens = _TOKEN_RE.findall(text.lower())
    return not tokens or all(t in FILLER_WORDS for t in tokens)


def segment_spans(text: str, limit: int) -> list[tuple[int, int]]:
    """Character spans [start, end) that cover text in windows of at most limit characters.

    Windows hold whole sentences, as many as fit; a sentence longer than limit is
    split at spaces (or, with no space in reach, at limit). Every non-space
    character of text lies in exactly one span.
    """
    if len(text) <= limit:
        return [(0, len(text))] if text.strip() else []
    sentences: list[tuple[int, int]] = []
    start = 0
    for m in _SENTENCE_END_RE.finditer(text):
        sentences.append((start, m.end()))
        start = m.end()
    sentences.append((start, len(text)))
    pieces: list[tuple[int, int]] = []
    for a, b in sentences:
        while b - a > limit:  # one sentence longer than a window: cut at a word
            space = text.rfind(" ", a + limit // 2, a + limit)
            cut = space if space > a else a + limit
            pieces.append((a, cut))
            a = cut
        pieces.append((a, b))
    spans: list[tuple[int, int]] = []
    for a, b in pieces:
        if spans and b - spans[-1][0] <= limit:
            spans[-1] = (spans[-1][0], b)
        else:
            spans.append((a, b))
    return [(a, b) for a, b in spans if text[a:b].strip()]


def truncate(text: str, limit: int) -> str:
    """Cut text to limit characters at a sentence end, else at a word, marking the cut."""
    if len(text) <= limit:
        return text
    window = text[: limit - 1]
    ends = [m.end() for m in _SENTENCE_END_RE.finditer(window)]
    if ends and ends[-1] >= limit // 2:
        return window[: ends[-1]].rstrip()
    space = window.rfind(" ")
    cut = window[:space] if space >= limit // 2 else window
    return cut.rstrip(" ,;:") + "\u2026"


def importance(text: str, *, found_facts: bool) -> float:
    """How much a memory matters, from cheap cues: facts, plans, feelings, life events."""
    tokens = _TOKEN_RE.findall(text.lower())
    score = 0.3
    if found_facts:
        score += 0.3
    if any(t in EMOTION_WORDS for t in tokens):
        score += 0.15
    if any(t in LIFE_EVENT_WORDS for t in tokens):
        score += 0.15
    if len(tokens) >= 25:
        score += 0.05
    if len(tokens) <= 3 and not found_facts:
        score -= 0.1  # short small talk that was not pure filler
    return round(min(max(score, 0.05), 0.95), 2)
