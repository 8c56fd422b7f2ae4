"""The small machine the rule catalogues run on: a turn, its sentences, and rules.

A :class:`Rule` is a precompiled trigger regex, a few cheap substrings that must
appear for the regex to be worth trying, and a handler that reads what follows
the trigger and records proposals on the :class:`Turn`. The turn attaches the
evidence itself, so no handler can forget it, and it de-duplicates: the same
fact found by two rules is proposed once, with the higher confidence.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

from domain.values import (
    ATTRIBUTE_KEYS,
    AttributeProposal,
    IntentProposal,
    IntentStatus,
    IntentUpdateProposal,
)
from uprof.adapters.extraction.text import clean, hedge_factor, is_hypothetical

#: Longest value or description kept; longer ones are a sign the rule over-read.
MAX_VALUE_CHARS = 120
#: How far a handler looks after and before its trigger. Values are short, and a
#: bounded window keeps a pathological sentence (thousands of "I'm a") linear.
AFTER_WINDOW = 300
BEFORE_WINDOW = 200
#: Most matches of one rule in one sentence; real sentences have one or two.
MAX_MATCHES_PER_RULE = 24
#: Highest confidence of an attribute another speaker stated about the subject.
REPORTED_CONFIDENCE = 0.5

#: Words shared by several rule catalogues.
ADV = (
    r"(?:\s+(?:really|also|actually|currently|now|still|just|totally|absolutely|definitely|"
    r"truly|honestly|genuinely|kinda|kind\s+of|sort\s+of|pretty\s+much|so|very|quite|"
    r"mostly|mainly|especially|even|already|recently|finally|basically|seriously|"
    r"literally|do|personally|obviously|certainly|simply|deeply|madly|generally|"
    r"usually|always|officially|probably|maybe|perhaps|possibly))*"
)
I_AM = r"\bI(?:'m|\s+am|m)\b"
NEG = r"(?:don't|do\s+not|dont|never)"


@dataclass
class Turn:
    """Everything extracted from one captured interaction so far."""

    capture_id: str
    occurred_at: datetime
    #: The user types no capital letters at all, so capitals cannot mark names.
    lowercase_mode: bool
    #: Most words are capitalised (title case or shouting): capitals mark nothing.
    capitals_unreliable: bool
    #: Another speaker said it about the subject: attributes are ``reported``, at most
    #: REPORTED_CONFIDENCE, and plans are not the subject's.
    reported: bool = False
    #: How the subject is named (the capture's subject actor or actor), "" when unknown.
    subject_name: str = ""
    #: Multiplies the confidence of what the current clause states: below 1 when the
    #: user hedges ("I think I'm allergic to..."); set by :func:`run_rules` per match.
    hedge: float = 1.0
    attributes: dict[tuple[str, str, bool], AttributeProposal] = field(default_factory=dict)
    intents: dict[str, IntentProposal] = field(default_factory=dict)
    updates: dict[tuple[IntentStatus, str], IntentUpdateProposal] = field(default_factory=dict)

    @property
    def evidence(self) -> tuple[str, ...]:
        return (self.capture_id,)

    def attribute(
        self,
        key: str,
        value: str,
        confidence: float,
        *,
        supersedes: bool = False,
        negated: bool = False,
    ) -> None:
        """Record an attribute the user stated about themselves."""
        value = clean(value)
        if key not in ATTRIBUTE_KEYS or not _plausible(value):
            return
        confidence *= self.hedge
        if self.reported:
            confidence = min(confidence, REPORTED_CONFIDENCE)
        ident = (key, value.casefold(), negated)
        old = self.attributes.get(ident)
        if old is not None:
            confidence = max(confidence, old.confidence)
            supersedes = supersedes or old.supersedes
        self.attributes[ident] = AttributeProposal(
            key=key,
            value=value,
            evidence=self.evidence,
            confidence=round(min(max(confidence, 0.0), 1.0), 3),
            explicit=True,
            supersedes=supersedes,
            negated=negated,
            reported=self.reported,
        )

    def intent(self, description: str, confidence: float, expires_at: datetime | None) -> None:
        """Record a plan or goal the user stated."""
        description = clean(description)
        if self.reported or not _plausible(description):
            return  # somebody else's words do not make the subject's plans
        confidence *= self.hedge
        ident = description.casefold()
        old = self.intents.get(ident)
        if old is not None:
            confidence = max(confidence, old.confidence)
            expires_at = expires_at or old.expires_at
        self.intents[ident] = IntentProposal(
            description=description,
            evidence=self.evidence,
            category="goal",
            confidence=round(min(max(confidence, 0.0), 1.0), 3),
            expires_at=expires_at,
        )

    def update(self, status: IntentStatus, description: str) -> None:
        """Record that the user finished or dropped a plan, named by its description."""
        description = clean(description)
        if self.reported or not _plausible(description):
            return
        self.updates[(status, description.casefold())] = IntentUpdateProposal(
            status=status, description=description, evidence=self.evidence
        )

    def found_anything(self) -> bool:
        return bool(self.attributes or self.intents or self.updates)


def _plausible(value: str) -> bool:
    return 0 < len(value) <= MAX_VALUE_CHARS and any(c.isalnum() for c in value)


@dataclass(frozen=True)
class Sentence:
    """One sentence of the user's turn, with the turn it belongs to."""

    text: str
    lower: str
    turn: Turn

    def after(self, m: re.Match[str], group: int | str = 0) -> str:
        """The text after a trigger match (or one of its groups): where the value is."""
        end = m.end(group)
        return self.text[end : end + AFTER_WINDOW]

    def before(self, m: re.Match[str]) -> str:
        """The text just before a trigger match, for rules whose value comes first."""
        return self.text[max(0, m.start() - BEFORE_WINDOW) : m.start()]

    def starts_sentence(self, prefix: str, m: re.Match[str]) -> bool:
        """Whether prefix (from :meth:`before`) reaches back to the sentence start."""
        return len(prefix) == m.start()


Handler = Callable[[re.Match[str], Sentence], None]


@dataclass(frozen=True)
class Rule:
    """A trigger regex, the substrings it needs, and what to do when it fires."""

    name: str
    #: Lower-case substrings, one of which must appear for the trigger to be tried:
    #: a single C-level search that skips most rules on most sentences.
    guard: re.Pattern[str] | None
    pattern: re.Pattern[str]
    handler: Handler
    #: Skip matches inside "if ...", "she says ...": they are not the user's statement.
    skip_hypothetical: bool = True
    #: A regex the sentence must contain before the trigger is tried at all.
    gate: re.Pattern[str] | None = None


def rule(
    name: str,
    guards: Iterable[str],
    pattern: str,
    *,
    skip_hypothetical: bool = True,
    gate: str | None = None,
) -> Callable[[Handler], Rule]:
    """Decorator: compile the pattern once and turn the handler into a :class:`Rule`."""
    guard_list = [g.lower() for g in guards]
    guard = re.compile("|".join(map(re.escape, guard_list))) if guard_list else None
    compiled = re.compile(pattern, re.IGNORECASE)
    compiled_gate = re.compile(gate, re.IGNORECASE) if gate else None

    def wrap(handler: Handler) -> Rule:
        return Rule(name, guard, compiled, handler, skip_hypothetical, compiled_gate)

    return wrap


def run_rules(sentence: Sentence, rules: Iterable[Rule]) -> None:
    """Apply each rule whose guards appear in the sentence."""
    lower = sentence.lower
    for r in rules:
        if r.guard is not None and r.guard.search(lower) is None:
            continue
        if r.gate is not None and r.gate.search(sentence.text) is None:
            continue
        for i, m in enumerate(r.pattern.finditer(sentence.text)):
            if i >= MAX_MATCHES_PER_RULE:
                break
            if r.skip_hypothetical and is_hypothetical(sentence.text, m.start()):
                continue
            sentence.turn.hedge = hedge_factor(sentence.text, m.start())
            try:
                r.handler(m, sentence)
            finally:
                sentence.turn.hedge = 1.0
