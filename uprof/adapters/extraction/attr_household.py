"""Attribute rules about the user's household and habits: pets, family, routine, contact."""

from __future__ import annotations

import re

from uprof.adapters.extraction.attr_common import NUM, parse_number
from uprof.adapters.extraction.engine import ADV, AFTER_WINDOW, I_AM, Rule, Sentence, rule
from uprof.adapters.extraction.lexicon import (
    FAMILY_CANONICAL,
    FAMILY_RELATIONS,
    NAMED_ONLY_RELATIONS,
    PET_ADJECTIVES,
    PET_SINGULAR,
    PETS,
    PRONOUN_OBJECTS,
)
from uprof.adapters.extraction.text import (
    CLAUSE_CUT_RE,
    clean,
    cut_clause,
    first_to_lower,
    leading_words,
    take_name,
)

# --- Pets and family ---------------------------------------------------------------------

_PET = "|".join(sorted(PETS, key=len, reverse=True))
_PET_ADJ = "|".join(sorted(PET_ADJECTIVES, key=len, reverse=True))
_RELATIONS = FAMILY_RELATIONS | NAMED_ONLY_RELATIONS
_REL = "|".join(sorted((re.escape(r) for r in _RELATIONS), key=len, reverse=True))
_COUNT = r"a|an|one|two|three|four|five|six|seven|eight|nine|ten|\d{1,2}"
#: Words allowed right after "I have a dog": anything else makes "dog" a modifier.
_AFTER_NOUN = frozenset(
    """
    and named called who that which at in with too as now but so from whose whom
    i'm i we here there at home back
    """.split()
)
_NAME_LINK_RE = re.compile(
    r"(?:'s\s+name\s+is|\s+is\s+(?:named|called)|\s+(?:named|called)|,)?\s+", re.IGNORECASE
)
_GONE_RE = re.compile(
    r"\s*,?\s*(?:just\s+|recently\s+|sadly\s+)?(?:died|passed\s+away|passed|ran\s+away|"
    r"was\s+put\s+down|had\s+to\s+be\s+put\s+down|is\s+gone)\b",
    re.IGNORECASE,
)


def _names_after(rest: str) -> tuple[list[str], int]:
    """Names following a pet or relative: "named Tom and Jerry", ", Luna,", " Rex"."""
    link = _NAME_LINK_RE.match(rest)
    if link is None:
        return [], 0
    pos = link.end()
    names: list[str] = []
    end = pos
    # "a sister named mary": an explicit naming verb makes a lower-case word a name.
    explicit = bool(re.search(r"named|called|name\s+is", link.group(), re.IGNORECASE))
    while len(names) < 4:
        found = take_name(rest[pos:], allow_lower=explicit and not names, max_words=2)
        if not found:
            break
        names.append(found[0])
        pos += found[1]
        end = pos
        more = re.match(r"\s*(?:,\s*|\s+and\s+|\s*&\s*)", rest[pos:])
        if not more or not link.group().strip():
            break  # a bare apposition names only one: "my dog Rex and I"
        pos += more.end()
    if not names:
        return [], 0
    if rest.startswith("'s", end):
        end += 2
    return names, end


def _family_value(relation: str) -> str:
    return FAMILY_CANONICAL.get(relation, relation)


def _plural(relation: str) -> str:
    canonical = _family_value(relation)
    if canonical in {"children", "babies", "siblings", "parents", "grandchildren"}:
        return canonical
    if canonical == "child":
        return "children"
    return canonical if canonical.endswith("s") else canonical + "s"


_PET_PLURAL = {v: k for k, v in PET_SINGULAR.items()}


def _pet_plural(noun: str) -> str:
    if noun in PET_SINGULAR or noun in {"fish", "goldfish"}:
        return noun
    return _PET_PLURAL.get(noun, noun + "s")


def _singular(relation: str) -> str:
    canonical = _family_value(relation)
    return {
        "children": "child",
        "babies": "baby",
        "siblings": "sibling",
        "grandchildren": "grandchild",
    }.get(canonical, PET_SINGULAR.get(canonical, canonical))


_FAMILY_ADJ = r"older|younger|little|big|baby|twin|eldest|oldest|youngest|teenage|grown|adult"
#: "I have a boy and a girl": children named by their sex.
_CHILD_WORDS = {"boy": "son", "boys": "sons", "girl": "daughter", "girls": "daughters"}
#: One more counted thing after a first: ", two dogs", " and a cat".
_MORE_RE = re.compile(
    r"\s*(?:,\s*(?:and\s+)?|\s+and\s+|\s*&\s*)(?P<count>" + _COUNT + r")\s+"
    r"(?:(?:" + _PET_ADJ + "|" + _FAMILY_ADJ + r")\s+)?(?P<noun>[a-z]+)\b",
    re.IGNORECASE,
)


@rule(
    "have_pet_or_family",
    ["have", "own", "got", "adopted", "rescued"],
    r"\bI(?:'ve|\s+have)?" + ADV + r"\s+(?:have|own|got|adopted|rescued)\s+"
    r"(?P<count>" + _COUNT + r")\s+(?:\d{1,2}[\s-](?:year|month|week)s?[\s-]old\s+)?"
    r"(?:(?:" + _PET_ADJ + "|" + _FAMILY_ADJ + r")\s+)?(?P<noun>[a-z]+(?:-[a-z]+)*)\b",
)
def _have_pet_or_family(m: re.Match[str], s: Sentence) -> None:
    """ "I have two cats named Tom and Jerry", "I have a daughter", "I have 3 kids"."""
    if _have_one(s, m.group("count"), m.group("noun").lower(), s.after(m), first=True):
        _have_more(s, s.after(m))


def _have_more(s: Sentence, rest: str) -> None:
    """ "I have three cats and two dogs": every further counted pet or relative."""
    # Skip what the first item already took ("cats named Tom and Jerry").
    pos = _names_after(rest)[1] if re.match(r"\s+(?:named|called)\b", rest, re.I) else 0
    for _ in range(6):
        more = _MORE_RE.match(rest, pos)
        if more is None:
            return
        after = rest[more.end() :]
        if not _have_one(s, more.group("count"), more.group("noun").lower(), after, first=False):
            return
        pos = more.end()
        if re.match(r"\s+(?:named|called)\b", after, re.I):
            pos += _names_after(after)[1]


def _have_one(s: Sentence, raw_count: str, noun: str, rest: str, *, first: bool) -> bool:
    """Record one "I have <count> <noun>"; False when the noun is no pet or relative."""
    if noun in _CHILD_WORDS:
        noun = _CHILD_WORDS[noun]
    is_pet = noun in PETS
    parent = noun in NAMED_ONLY_RELATIONS and re.match(r"\s+(?:who|that|named|called)\b", rest)
    if not is_pet and noun not in FAMILY_RELATIONS and not parent:
        return False
    count = parse_number(raw_count) or 1
    names, end = _names_after(rest) if re.match(r"\s+(?:named|called)\b", rest, re.I) else ([], 0)
    after = rest[end:]
    follower = leading_words(after, limit=1)
    if after.startswith(" ") and follower and follower[0].lower not in _AFTER_NOUN:
        if not follower[0].is_capitalised():
            return False  # "a cat allergy", "a dog walker": the noun is a modifier
    key = "pet" if is_pet else "family"
    single = _singular(noun)
    if names:
        for name in names:
            s.turn.attribute(key, f"{single} named {name}", 0.85)
    elif count > 1:
        plural = _pet_plural(noun) if is_pet else _plural(noun)
        s.turn.attribute(key, f"{count} {plural}", 0.85)
    else:
        s.turn.attribute(key, single, 0.85 if first else 0.8)
    return True


@rule(
    "pets_listed",
    ["pets", "animals", "kids", "children"],
    r"\bI(?:'ve|\s+have)?\s+(?:have|own|got)\s+(?:a\s+lot\s+of|lots\s+of|many|several|"
    r"a\s+few|some|(?:two|three|four|five|six|seven|eight|nine|ten|\d{1,2}))\s+"
    r"(?:pets|animals|kids|children)\s*(?=[,:])",
)
def _pets_listed(m: re.Match[str], s: Sentence) -> None:
    """ "I have a lot of pets, 6 dogs and 4 cats": the items that follow the colon or comma."""
    rest = s.after(m)
    first = re.match(
        r"[,:]\s*(?:including\s+|like\s+)?(?P<count>" + _COUNT + r")\s+(?P<noun>[a-z]+)\b",
        rest,
        re.IGNORECASE,
    )
    if first and _have_one(
        s, first.group("count"), first.group("noun").lower(), rest[first.end() :], first=True
    ):
        _have_more(s, rest[first.end() :])


@rule(
    "have_no_pet_or_family",
    ["have"],
    r"\bI\s+(?:don't|do\s+not|dont)\s+have\s+(?:a|an|any)\s+(?P<noun>[a-z]+)\b"
    r"|\bI\s+have\s+no\s+(?P<noun2>[a-z]+)\b",
)
def _have_no_pet_or_family(m: re.Match[str], s: Sentence) -> None:
    noun = (m.group("noun") or m.group("noun2")).lower()
    if noun in PETS or noun in {"pets", "pet"}:
        s.turn.attribute(
            "pet", "pets" if noun in {"pets", "pet"} else _singular(noun), 0.75, negated=True
        )
    elif noun in {"kids", "children", "kid", "child"}:
        s.turn.attribute("family", "children", 0.75, negated=True)
    elif noun in FAMILY_RELATIONS:
        s.turn.attribute("family", _singular(noun), 0.75, negated=True)


@rule(
    "my_pet",
    ["my "],
    r"\bmy\s+(?:(?P<count>two|three|four|five|six|seven|eight|nine|ten|\d{1,2})\s+)?"
    r"(?:(?:" + _PET_ADJ + r")\s+)?(?P<noun>" + _PET + r")(?![\w-])",
)
def _my_pet(m: re.Match[str], s: Sentence) -> None:
    noun = m.group("noun").lower()
    rest = s.after(m)
    names, end = _names_after(rest)
    gone = _GONE_RE.match(rest[end:]) is not None
    single = _singular(noun)
    count = parse_number(m.group("count")) if m.group("count") else None
    if count and count > 1 and not names:
        s.turn.attribute("pet", f"{count} {_pet_plural(noun)}", 0.8, negated=gone)
    elif names:
        for name in names:
            s.turn.attribute(
                "pet", f"{single} named {name}", 0.85 if not gone else 0.75, negated=gone
            )
    else:
        s.turn.attribute("pet", noun, 0.7, negated=gone)


@rule(
    "my_family",
    ["my "],
    r"\bmy\s+(?:(?P<count>two|three|four|five|six|\d)\s+)?(?P<mod>ex-|ex\s+|late\s+|step-?)?"
    r"(?P<rel>" + _REL + r")(?![\w-])",
)
def _my_family(m: re.Match[str], s: Sentence) -> None:
    """ "my wife Anna", "my two kids", "my late husband"; parents only with a name."""
    rel = m.group("rel").lower()
    mod = (m.group("mod") or "").strip().lower()
    rest = s.after(m)
    names, end = _names_after(rest)
    if rel in NAMED_ONLY_RELATIONS and not names and not _states_about(s, m, rest):
        return
    single = _singular(rel)
    if not mod and _GONE_RE.match(rest[end:]):
        mod = "late"  # "My husband died last year" is "my late husband"
        single = _family_value(rel) if rel.endswith("s") else single
    if mod.startswith("ex"):
        single = f"ex-{single}"
    elif mod == "late":
        single = f"late {single}"
    elif mod.startswith("step"):
        single = f"step{single}"
    count = parse_number(m.group("count")) if m.group("count") else None
    if names:
        for name in names:
            s.turn.attribute("family", f"{single} named {name}", 0.85)
    elif count and count > 1:
        s.turn.attribute("family", f"{count} {_plural(rel)}", 0.8)
    else:
        value = _family_value(rel) if not mod else single
        s.turn.attribute("family", value, 0.7)


#: What a sentence may say right after "My dad" that is not about the relative at all.
_HEARSAY_RE = re.compile(
    r"\s+(?:says|said|thinks|thought|told|tells|asked|asks|wants\s+me|wanted\s+me|and\s+I)\b"
    r"|'s\b",
    re.IGNORECASE,
)


def _states_about(s: Sentence, m: re.Match[str], rest: str) -> bool:
    """ "My dad was a doctor": a sentence about a parent says the user has one.

    Everybody has parents, so "my mom" in passing ("I called my mom") is not recorded;
    a sentence that opens with the relative and goes on to describe them is.
    """
    return (
        m.start() == 0 and re.match(r"\s+[a-z]", rest) is not None and not _HEARSAY_RE.match(rest)
    )


@rule(
    "married",
    ["married", "engaged"],
    I_AM + ADV + r"\s+(?:happily\s+)?(?P<state>married|engaged)\b(?P<to>\s+to\s+)?",
)
def _married(m: re.Match[str], s: Sentence) -> None:
    relation = "spouse" if m.group("state").lower() == "married" else "fiancé(e)"
    rest = s.after(m)
    if m.group("to"):
        found = take_name(rest, allow_lower=False, max_words=2)
        if not found:
            return  # "married to my job"
        s.turn.attribute("family", f"{relation} named {found[0]}", 0.85)
        return
    s.turn.attribute("family", relation, 0.85)
    kids = re.match(
        r"\s+with\s+(?P<n>" + _COUNT + r")\s+(?:kids|children|sons|daughters)\b", rest, re.I
    )
    if kids:
        n = parse_number(kids.group("n")) or 1
        s.turn.attribute("family", f"{n} children" if n > 1 else "child", 0.8)


@rule(
    "not_married",
    ["married", "divorced", "separated", "widow"],
    I_AM
    + r"\s+(?:not|no\s+longer)\s+married\b|"
    + I_AM
    + r"\s+(?:now\s+)?(?:divorced|separated|widowed)\b",
)
def _not_married(m: re.Match[str], s: Sentence) -> None:
    s.turn.attribute("family", "spouse", 0.75, negated=True)


@rule(
    "married_verb",
    ["married"],
    r"\bI(?:\s+just|\s+recently|\s+finally)?\s+(?:got\s+married|married\s+(?=my|an?|the|(?-i:[A-Z])))",
)
def _married_verb(m: re.Match[str], s: Sentence) -> None:
    """ "I married my high school sweetheart", "I got married last year"."""
    s.turn.attribute("family", "spouse", 0.8)


@rule(
    "dating",
    ["dating", "seeing", "relationship"],
    r"\bI(?:'m|\s+am)\s+(?:currently\s+|now\s+|happily\s+)?(?:dating|seeing|in\s+a\s+"
    r"(?:serious\s+|long[\s-]distance\s+)?relationship\s+with)\s+(?:an?\s+|the\s+)?"
    r"(?:\w+\s+)?(?P<who>girl|woman|lady|guy|man|boy)?"
    r"|\bthe\s+(?P<who2>girl|woman|lady|guy|man|boy)\s+I(?:'m|\s+am)\s+(?:dating|seeing)\b",
)
def _dating(m: re.Match[str], s: Sentence) -> None:
    who = (m.group("who") or m.group("who2") or "").lower()
    if who in {"girl", "woman", "lady"}:
        value = "girlfriend"
    elif who in {"guy", "man", "boy"}:
        value = "boyfriend"
    else:
        value = "partner"
    s.turn.attribute("family", value, 0.75)


_PARENT_WORDS = {
    "mom": ("child", "female"),
    "mum": ("child", "female"),
    "mother": ("child", "female"),
    "dad": ("child", "male"),
    "father": ("child", "male"),
    "parent": ("child", ""),
    "grandmother": ("grandchildren", "female"),
    "grandma": ("grandchildren", "female"),
    "grandfather": ("grandchildren", "male"),
    "grandpa": ("grandchildren", "male"),
}


@rule(
    "parent_i_am",
    ["mom", "mum", "mother", "dad", "father", "parent", "grand"],
    I_AM + ADV + r"\s+an?\s+(?P<mod>(?:new|single|proud|working|first[\s-]time|young|"
    r"busy|stay[\s-]at[\s-]home)\s+)?(?P<role>mom|mum|mother|dad|father|parent|"
    r"grandmother|grandma|grandfather|grandpa)(?![\w-])",
)
def _parent_i_am(m: re.Match[str], s: Sentence) -> None:
    """ "I'm a mom", "I am a new mother with twins": children, and the parent's gender."""
    rest = s.after(m)
    if re.match(r"\s+(?:of|to)\s+\w", rest, re.IGNORECASE):
        return  # "a mother of two" is the parent_of rule's
    if re.match(r"\s*-?\s*(?:to-be|figure)\b", rest, re.IGNORECASE):
        return
    relation, gender = _PARENT_WORDS[m.group("role").lower()]
    kids = re.match(
        r"\s+(?:with|of)\s+(?P<n>" + _COUNT + r")?\s*(?P<noun>twins|triplets|kids|children|sons|"
        r"daughters|boys|girls)\b",
        rest,
        re.IGNORECASE,
    )
    if kids and kids.group("noun").lower() in {"twins", "triplets"}:
        s.turn.attribute("family", kids.group("noun").lower(), 0.8)
    elif kids and kids.group("n"):
        n = parse_number(kids.group("n")) or 1
        s.turn.attribute("family", f"{n} children" if n > 1 else "child", 0.8)
    else:
        s.turn.attribute("family", relation, 0.75)
    if gender:
        s.turn.attribute("gender", gender, 0.7)
    mod = " ".join((m.group("mod") or "").lower().replace("-", " ").split())
    if mod == "stay at home":
        s.turn.attribute("occupation", f"stay-at-home {m.group('role').lower()}", 0.75)


_GENDER_WORDS = {
    "woman": "female",
    "lady": "female",
    "girl": "female",
    "gal": "female",
    "female": "female",
    "man": "male",
    "guy": "male",
    "boy": "male",
    "dude": "male",
    "male": "male",
}
_GENDER_FOLLOWERS = frozenset("who that with and but in from of living so here there now".split())


@rule(
    "gender",
    [
        "woman",
        "lady",
        "girl",
        "gal",
        "female",
        "man",
        "guy",
        "boy",
        "dude",
        "male",
        "son",
        "daughter",
    ],
    I_AM + ADV + r"\s+(?:an?\s+)?(?:(?:young|old|older|little|single|married|grown|tall|short|"
    r"middle[\s-]aged|\d{1,2}[\s-]year[\s-]old)\s+)?(?P<word>woman|lady|girl|gal|female|man|guy|"
    r"boy|dude|male)(?![\w-])"
    r"|" + I_AM + r"\s+(?:the|a|an)\s+(?:only\s+|eldest\s+|youngest\s+)?(?P<child>son|daughter)"
    r"\s+of\b",
)
def _gender(m: re.Match[str], s: Sentence) -> None:
    """ "I am a woman", "I'm the son of a farmer": the speaker's gender."""
    if m.group("child"):
        s.turn.attribute("gender", "male" if m.group("child").lower() == "son" else "female", 0.7)
        return
    rest = s.after(m)
    words = leading_words(rest, limit=1)
    if rest[:1] == " " and words and words[0].lower not in _GENDER_FOLLOWERS:
        return  # "I'm a man of my word" keeps; "I'm a girl scout" is something else
    s.turn.attribute("gender", _GENDER_WORDS[m.group("word").lower()], 0.8)


@rule(
    "parent_of",
    ["of ", "to "],
    I_AM + r"\s+an?\s+(?:single\s+|proud\s+|working\s+)?(?:mom|mum|mother|dad|father|parent)\s+"
    r"(?:of|to)\s+" + NUM + r"\b",
)
def _parent_of(m: re.Match[str], s: Sentence) -> None:
    n = parse_number(m.group("num"))
    if n and n <= 20:
        s.turn.attribute("family", f"{n} children" if n > 1 else "child", 0.8)


# --- Routine ------------------------------------------------------------------------------

_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_FREQ_STRONG_RE = re.compile(
    r"\b(?:every|each)\s+(?:single\s+)?(?:morning|evening|night|day|afternoon|week|weekend|"
    r"weekday|month|year|other\s+day|lunch(?:time)?|" + "|".join(_WEEKDAYS) + r")\b"
    r"|\bon\s+(?:weekends|weekdays|" + "|".join(d + "s" for d in _WEEKDAYS) + r")\b"
    r"|\b(?:once|twice|three\s+times|four\s+times|five\s+times|a\s+few\s+times|several\s+times|"
    r"\d+\s+times|\d+x)\s+(?:a|per|each|every)\s+(?:day|week|month|year)\b"
    r"|\b(?:daily|weekly|nightly)\b|\bmost\s+(?:mornings|evenings|nights|days|weekends)\b"
    r"|\b(?:" + "|".join(d + "s" for d in _WEEKDAYS) + r")\b",
    re.IGNORECASE,
)
_FREQ_WEAK_RE = re.compile(
    r"\b(?:in\s+the\s+(?:morning|evening|afternoon)s?|at\s+night|before\s+(?:work|bed|school)|"
    r"after\s+(?:work|school|dinner|lunch)|on\s+(?:the\s+)?weekends?|at\s+weekends|at\s+lunch|"
    r"at\s+(?:around\s+)?\d{1,2}(?::\d{2})?\s*(?:am|pm|a\.m\.|p\.m\.)?(?!\w))",
    re.IGNORECASE,
)
_HABIT = r"usually|always|normally|typically|often|generally|regularly|tend\s+to|try\s+to|like\s+to"
_NOT_ROUTINE_VERBS = (
    r"am|'m|was|were|have\s+to|had|don't|do\s+not|dont|never|can't|cannot|won't|will|would|'d|"
    r"'ll|think|feel|felt|guess|hope|want|need|like|love|hate|wish|should|could|might|must|may|"
    r"did|didn't|used|mean|know|believe|just|really|also|still|can|get|got|is|" + _HABIT
)


@rule(
    "routine",
    [],
    r"\bI(?P<habit>\s+(?:"
    + _HABIT
    + r"))?\s+(?!(?:"
    + _NOT_ROUTINE_VERBS
    + r")\b)(?P<verb>[a-z]+)\b",
    gate=_FREQ_STRONG_RE.pattern + "|" + _FREQ_WEAK_RE.pattern,
)
def _routine(m: re.Match[str], s: Sentence) -> None:
    """ "Every morning I go for a run" -> "go for a run every morning"."""
    tail = cut_clause(s.text[m.start("verb") :][:AFTER_WINDOW])
    prefix = s.before(m).rstrip(" ,")
    start = 0
    for b in CLAUSE_CUT_RE.finditer(prefix):
        start = b.end()
    before = prefix[start:]
    cue, conf = _routine_cue(tail, before, habitual=bool(m.group("habit")))
    if cue is None:
        return
    words = clean(tail).split()[:14]
    if len(words) > 1 and words[1].lower() in PRONOUN_OBJECTS:
        return  # "I do it every day": the activity is named elsewhere
    phrase = " ".join(words)
    if cue.lower() not in phrase.lower():
        phrase = f"{phrase} {cue}"
    phrase = first_to_lower(phrase)
    phrase = re.sub(
        r"\b(" + "|".join(_WEEKDAYS) + r")",
        lambda x: x.group(1).capitalize(),
        phrase,
        flags=re.IGNORECASE,
    )
    s.turn.attribute("routine", phrase, conf)


def _routine_cue(tail: str, before: str, *, habitual: bool) -> tuple[str | None, float]:
    for text in (tail, before):
        strong = _FREQ_STRONG_RE.search(text)
        if strong:
            return strong.group().lower(), 0.7
    if habitual or re.search(r"\b(?:usually|always|normally|typically)\b", before, re.I):
        for text in (tail, before):
            weak = _FREQ_WEAK_RE.search(text)
            if weak:
                return weak.group().lower(), 0.6
    return None, 0.0


@rule(
    "chronotype",
    ["person", "riser", "owl", "bird"],
    I_AM + ADV + r"\s+(?:an?\s+)?(?P<kind>morning\s+person|night\s+person|evening\s+person|"
    r"early\s+riser|late\s+riser|night\s+owl|early\s+bird)\b",
)
def _chronotype(m: re.Match[str], s: Sentence) -> None:
    """ "I am a morning person": when in the day the user is active."""
    s.turn.attribute("routine", " ".join(m.group("kind").lower().split()), 0.75)


# --- Contact -------------------------------------------------------------------------------

_EMAIL_RE = r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b"
_EMAIL_CONTEXT_RE = re.compile(
    r"\bmy\s+(?:\w+\s+)?(?:email|e-mail|mail|address|contact)\b|\b(?:email|e-mail|mail|"
    r"write\s+to|write|reach|contact|ping)\s+me\b|\bI(?:'m|\s+am)\s+(?:at|reachable)\b|"
    r"\bme\s+at\b|\bI\s+can\s+be\s+reached\b",
    re.IGNORECASE,
)
_PHONE_RE = r"(?<![\w+])\+?\(?\d[\d\s().-]{5,}\d(?![\w@])"
_PHONE_CONTEXT_RE = re.compile(
    r"\bmy\s+(?:\w+\s+)?(?:phone|number|cell|mobile|whatsapp|tel|telephone)\b|"
    r"\b(?:call|text|reach|ring|whatsapp|phone)\s+me\b|\bme\s+(?:at|on)\b",
    re.IGNORECASE,
)


@rule("email", ["@"], _EMAIL_RE)
def _email(m: re.Match[str], s: Sentence) -> None:
    if _EMAIL_CONTEXT_RE.search(s.text):
        s.turn.attribute("email", m.group().lower(), 0.9)


@rule(
    "phone",
    ["phone", "number", "call", "text", "reach", "ring", "whatsapp", "cell", "mobile", " me "],
    _PHONE_RE,
)
def _phone(m: re.Match[str], s: Sentence) -> None:
    digits = re.sub(r"\D", "", m.group())
    if not 7 <= len(digits) <= 15 or not _PHONE_CONTEXT_RE.search(s.text):
        return
    value = ("+" if m.group().lstrip("(").startswith("+") else "") + digits
    s.turn.attribute("phone", value, 0.85)


HOUSEHOLD_RULES: tuple[Rule, ...] = (
    _have_pet_or_family,
    _have_no_pet_or_family,
    _my_pet,
    _my_family,
    _married,
    _married_verb,
    _dating,
    _not_married,
    _parent_i_am,
    _gender,
    _parent_of,
    _pets_listed,
    _routine,
    _chronotype,
    _email,
    _phone,
)
