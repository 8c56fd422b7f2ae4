"""Intent rules: plans and goals the user states, and plans they finish or drop.

"I want to run a marathon by June" becomes the intent "run a marathon" that
lapses at the start of July; "I finished the marathon" and "I gave up on
running a marathon" become lifecycle updates matched by description. Requests
to the agent ("I want to know ...", "I'm going to be honest") are not goals.
"""

from __future__ import annotations

import re
from datetime import datetime

from domain.values import IntentStatus
from uprof.adapters.extraction.attr_person import languages_in
from uprof.adapters.extraction.engine import ADV, I_AM, Rule, Sentence, rule
from uprof.adapters.extraction.inflect import is_gerund, to_base
from uprof.adapters.extraction.lexicon import PRONOUN_OBJECTS, REQUEST_VERBS, WEAK_TAILS, WEAK_VERBS
from uprof.adapters.extraction.temporal import VAGUE_TIME_RE, find_deadline
from uprof.adapters.extraction.text import clean, cut_clause, first_to_lower, take_proper

#: Most words kept in a description: longer plans are cut, not dropped.
MAX_DESCRIPTION_WORDS = 15

_PAST_TIME_RE = re.compile(
    r"\s*\b(?:yesterday|today|tonight|last\s+(?:night|week|month|year|weekend)|"
    r"this\s+(?:morning|week|month|year)|earlier|just\s+now|at\s+last)\b",
    re.IGNORECASE,
)
_DANGLING_RE = re.compile(r"\s+(?:by|in|on|before|until|till|for|at|this|next|the)$", re.IGNORECASE)
_ANYMORE_RE = re.compile(r"\s*\b(?:anymore|any\s+more)\b", re.IGNORECASE)
#: "I'm going to the gym" is movement, "I'm going to run" is a plan.
_NOT_A_VERB_AFTER_GOING = frozenset(
    """
    the a an my your his her their our this that bed work school church class sleep
    college uni university town hospital office store shop doctor dentist gym party
    """.split()
)


def describe(
    rest: str, ref: datetime, *, gerund: bool = False, extra_when: str = ""
) -> tuple[str, datetime | None] | None:
    """Turn what follows "I want to" into (description, deadline), or None if no goal.

    The clause is cut at the first boundary; a time phrase becomes the deadline
    and leaves the description; vague time words are dropped. With ``gerund``,
    the first word must be an "-ing" form and is put in base form
    ("running a marathon" -> "run a marathon").
    """
    clause = cut_clause(rest)
    deadline = find_deadline(clause, ref)
    expires = None
    if deadline is not None:
        clause = clause[: deadline.start] + " " + clause[deadline.end :]
        expires = deadline.expires_at
    elif extra_when:
        extra = find_deadline(extra_when, ref)
        expires = extra.expires_at if extra else None
    clause = VAGUE_TIME_RE.sub("", clause)
    clause = " ".join(clause.split())
    clause = _DANGLING_RE.sub("", clean(clause))
    words = clause.split()
    if not words:
        return None
    if gerund:
        if not is_gerund(words[0]):
            return None
        words[0] = to_base(words[0])
    words = words[:MAX_DESCRIPTION_WORDS]
    if not _is_goal(words):
        return None
    return first_to_lower(" ".join(words)), expires


def _is_goal(words: list[str]) -> bool:
    """Refuse requests and empty plans: "know why", "be honest", "do it"."""
    first = words[0].lower()
    if first in REQUEST_VERBS or first in PRONOUN_OBJECTS or not first.isalpha():
        return False
    if first in WEAK_VERBS:
        second = words[1].lower() if len(words) > 1 else ""
        if not second or second in WEAK_TAILS or second in PRONOUN_OBJECTS:
            return False
    return True


def _intent(
    m: re.Match[str], s: Sentence, confidence: float, *, gerund: bool = False, extra_when: str = ""
) -> None:
    """Record the plan that follows the trigger, if it is a plan at all."""
    found = describe(s.after(m), s.turn.occurred_at, gerund=gerund, extra_when=extra_when)
    if found:
        s.turn.intent(found[0], confidence, found[1])


_WANT_CONFIDENCE = {
    "want": 0.7,
    "wanna": 0.7,
    "plan": 0.8,
    "intend": 0.8,
    "aim": 0.75,
    "hope": 0.6,
    "need": 0.6,
    "decided": 0.8,
    "mean": 0.6,
    "determined": 0.8,
    "always": 0.6,
}


@rule(
    "intent_want",
    ["want", "wanna", "plan", "intend", "aim", "hope", "need", "decided", "mean", "determined"],
    r"\bI(?:'ve|\s+have)?"
    + ADV
    + r"\s+(?P<verb>want|plan|intend|aim|hope|need|decided|mean|(?:am|'m)\s+determined)\s+to\s+"
    r"|\bI" + ADV + r"\s+(?P<wanna>wanna)\s+"
    r"|\bI(?:'ve|\s+have)\s+(?P<always>always)\s+wanted\s+to\s+",
)
def _intent_want(m: re.Match[str], s: Sentence) -> None:
    verb = (m.group("verb") or m.group("wanna") or m.group("always") or "want").lower().split()[-1]
    _intent(m, s, _WANT_CONFIDENCE.get(verb, 0.7))


@rule(
    "intent_would_like",
    ["'d", "would"],
    r"\bI(?:'d|\s+would)\s+(?:really\s+|also\s+|eventually\s+|still\s+)?(?P<verb>like|love)\s+to\s+",
)
def _intent_would_like(m: re.Match[str], s: Sentence) -> None:
    _intent(m, s, 0.65 if m.group("verb").lower() == "like" else 0.55)


_IM_CONFIDENCE = {
    "planning": 0.8,
    "going": 0.7,
    "gonna": 0.7,
    "hoping": 0.6,
    "aiming": 0.75,
    "intending": 0.8,
    "trying": 0.6,
    "about": 0.6,
    "looking": 0.65,
    "preparing": 0.7,
    "saving": 0.7,
}


@rule(
    "intent_im",
    [
        "planning",
        "going",
        "gonna",
        "hoping",
        "aiming",
        "intending",
        "trying",
        "about",
        "looking",
        "preparing",
        "saving",
    ],
    I_AM
    + ADV
    + r"\s+(?P<verb>planning|going|hoping|aiming|intending|trying|about|looking|preparing|"
    r"saving(?:\s+up)?)\s+to\s+|" + I_AM + ADV + r"\s+(?P<gonna>gonna)\s+",
)
def _intent_im(m: re.Match[str], s: Sentence) -> None:
    verb = (m.group("verb") or m.group("gonna")).lower().split()[0]
    rest = s.after(m)
    if verb == "going" and rest[:1].isupper() and not s.turn.capitals_unreliable:
        _going_to_place(s, rest)  # "I'm going to Paris next week": a trip
        return
    if verb in {"going", "gonna"}:
        first = rest.split(" ", 1)[0].lower().strip(".,!?") if rest else ""
        if first in _NOT_A_VERB_AFTER_GOING:
            return
    _intent(m, s, _IM_CONFIDENCE.get(verb, 0.6))


def _going_to_place(s: Sentence, rest: str) -> None:
    place = take_proper(rest, lowercase_mode=False)
    if place is None:
        return
    deadline = find_deadline(cut_clause(rest[place[1] :]), s.turn.occurred_at)
    s.turn.intent(f"go to {place[0]}", 0.65, deadline.expires_at if deadline else None)


@rule(
    "intent_thinking",
    ["thinking", "considering", "planning on", "counting on"],
    I_AM + ADV + r"\s+(?:(?P<verb>thinking|planning)\s+(?:about|of|on)|considering)\s+",
)
def _intent_thinking(m: re.Match[str], s: Sentence) -> None:
    planning = (m.group("verb") or "").lower() == "planning"
    _intent(m, s, 0.75 if planning else 0.5, gerund=True)


@rule(
    "intent_goal",
    [
        "goal",
        "plan",
        "dream",
        "aim",
        "objective",
        "resolution",
        "mission",
        "target",
        "intention",
        "wish",
    ],
    r"\bmy\s+(?:main\s+|big\s+|biggest\s+|new\s+|next\s+|long[\s-]term\s+|short[\s-]term\s+|"
    r"ultimate\s+|only\s+|personal\s+)?(?P<verb>goal|plan|dream|aim|objective|resolution|"
    r"new\s+year'?s\s+resolution|mission|target|intention|wish)"
    r"(?P<when>\s+for\s+(?:this|next|the)\s+(?:week|month|year|weekend))?\s+(?:is|was)\s+to\s+",
)
def _intent_goal(m: re.Match[str], s: Sentence) -> None:
    verb = m.group("verb").lower().split()[-1]
    conf = {"dream": 0.7, "wish": 0.6}.get(verb, 0.85)
    _intent(m, s, conf, extra_when=(m.group("when") or "").replace(" for ", " ", 1))


@rule(
    "intent_learning",
    ["learning", "studying"],
    I_AM + r"(?:\s+currently|\s+now|\s+also|\s+still|\s+slowly)?\s+(?P<verb>learning|studying)\s+"
    r"|\bI(?:'ve|\s+have)\s+been\s+(?P<verb2>learning|studying)\s+",
)
def _intent_learning(m: re.Match[str], s: Sentence) -> None:
    """ "I'm learning Spanish" is a goal in progress, not (yet) a language the user speaks."""
    verb = "learn" if (m.group("verb") or m.group("verb2")).lower() == "learning" else "study"
    rest = s.after(m)
    langs = languages_in(rest, limit=3)
    if langs:
        deadline = find_deadline(cut_clause(rest), s.turn.occurred_at)
        for lang in langs:
            s.turn.intent(f"{verb} {lang}", 0.8, deadline.expires_at if deadline else None)
        return
    found = describe(rest, s.turn.occurred_at)
    if found is None:
        return
    description, expires = found
    if description.split()[0].lower() in {
        "at",
        "in",
        "for",
        "with",
        "from",
        "about",
        "hard",
        "a",
        "lot",
    }:
        return  # "I'm studying at MIT", "I'm learning a lot"
    s.turn.intent(f"{verb} {description}", 0.6 if verb == "learn" else 0.55, expires)


@rule("intent_moving", ["moving"], I_AM + ADV + r"\s+moving\s+(?:back\s+)?to\s+")
def _intent_moving(m: re.Match[str], s: Sentence) -> None:
    """ "I'm moving to Lisbon next month": a plan; the home changes when it happens."""
    rest = s.after(m)
    place = take_proper(rest, lowercase_mode=s.turn.lowercase_mode)
    if place is None:
        return
    deadline = find_deadline(cut_clause(rest[place[1] :]), s.turn.occurred_at)
    s.turn.intent(f"move to {place[0]}", 0.75, deadline.expires_at if deadline else None)


# --- Lifecycle updates ---------------------------------------------------------------------


def _update_description(rest: str, *, allow_gerund: bool = True) -> str | None:
    """What was finished or dropped: "reading Dune last week" -> "read Dune"."""
    clause = _PAST_TIME_RE.sub("", cut_clause(rest))
    clause = _ANYMORE_RE.sub("", clause)
    clause = VAGUE_TIME_RE.sub("", clause)
    words = clean(" ".join(clause.split())).split()
    if not words:
        return None
    if allow_gerund and is_gerund(words[0]):
        words[0] = to_base(words[0])
    elif words[0].lower() in {"the", "a", "an"} and len(words) > 1:
        words = words[1:]
    words = words[:MAX_DESCRIPTION_WORDS]
    if not _is_goal(words):
        return None
    return first_to_lower(" ".join(words))


@rule(
    "update_fulfilled",
    ["finished", "completed", "achieved", "accomplished", "done", "did", "managed", "was able"],
    r"\bI(?:'ve|\s+have)?"
    + ADV
    + r"\s+(?:(?P<verb>finished|completed|achieved|accomplished)|(?P<did>did|done)"
    r"(?=\s+(?:a|an|the|my|our|this|that\s+\w+|\d)\b)|(?:managed|was\s+able)\s+to)\s+",
)
def _update_fulfilled(m: re.Match[str], s: Sentence) -> None:
    description = _update_description(s.after(m))
    if description:
        s.turn.update(IntentStatus.FULFILLED, description)


@rule(
    "update_gave_up",
    ["gave up", "given up", "decided not", "decided against", "stopped trying", "quit trying"],
    r"\bI(?:'ve|\s+have)?" + ADV + r"\s+(?:gave|given)\s+up\s+on\s+"
    r"(?:the\s+idea\s+of\s+|my\s+plans?\s+(?:to|of)\s+|trying\s+to\s+)?"
    r"|\bI(?:'ve|\s+have)?" + ADV + r"\s+decided\s+(?:not\s+to|against)\s+"
    r"|\bI\s+(?:stopped|quit)\s+trying\s+to\s+",
)
def _update_gave_up(m: re.Match[str], s: Sentence) -> None:
    description = _update_description(s.after(m))
    if description:
        s.turn.update(IntentStatus.ABANDONED, description)


@rule(
    "update_no_longer",
    ["no longer", "anymore", "any more"],
    r"\bI\s+(?P<nl>no\s+longer|don't|do\s+not|dont)\s+(?:really\s+)?(?:want|plan|intend|need|hope)\s+to\s+"
    r"|"
    + I_AM
    + r"\s+(?P<nl2>no\s+longer|not)\s+(?:planning|going|trying|hoping)\s+(?:on\s+)?to\s+",
)
def _update_no_longer(m: re.Match[str], s: Sentence) -> None:
    """Only "no longer" or "... anymore" drops a plan; "I don't want to" alone does not."""
    rest = s.after(m)
    no_longer = "longer" in (m.group("nl") or m.group("nl2") or "").lower()
    if not no_longer and not _ANYMORE_RE.search(cut_clause(rest)):
        return
    description = _update_description(rest)
    if description:
        s.turn.update(IntentStatus.ABANDONED, description)


INTENT_RULES: tuple[Rule, ...] = (
    _intent_want,
    _intent_would_like,
    _intent_im,
    _intent_thinking,
    _intent_goal,
    _intent_learning,
    _intent_moving,
    _update_fulfilled,
    _update_gave_up,
    _update_no_longer,
)
