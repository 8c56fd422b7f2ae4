"""Attribute rules about who the user is: name, age, home, origin, work, languages."""

from __future__ import annotations

import re

from uprof.adapters.extraction.attr_common import NUM, follower_ok, parse_number, states_change
from uprof.adapters.extraction.engine import ADV, I_AM, Rule, Sentence, rule
from uprof.adapters.extraction.lexicon import (
    DEMONYMS,
    EVALUATIVE,
    HOME_PLACES,
    LANGUAGES,
    NOT_OCCUPATIONS,
    OCCUPATION_SUFFIXES,
    OCCUPATIONS,
    PETS,
    TITLES,
    WORK_FIELDS,
    WORKPLACES,
)
from uprof.adapters.extraction.text import cut_clause, leading_words, take_name, take_proper

# --- Identity: name and age ---------------------------------------------------------------


@rule("name_is", ["name"], r"\bmy\s+name(?:'s|\s+is)\s+")
def _name_is(m: re.Match[str], s: Sentence) -> None:
    found = take_name(s.after(m), allow_lower=s.turn.lowercase_mode)
    if found:
        s.turn.attribute("name", found[0], 0.9)


@rule("name_is_not", ["name"], r"\bmy\s+name\s+(?:isn't|is\s+not|isnt|'s\s+not)\s+")
def _name_is_not(m: re.Match[str], s: Sentence) -> None:
    found = take_name(s.after(m), allow_lower=False)
    if found:
        s.turn.attribute("name", found[0], 0.8, negated=True)


@rule("call_me", ["call me", "go by"], r"\b(?:call\s+me|I\s+go\s+by)\s+")
def _call_me(m: re.Match[str], s: Sentence) -> None:
    before = s.before(m).lower().rstrip()
    if before.endswith(("don't", "not", "dont", "never")):
        return
    rest = s.after(m)
    found = take_name(rest, allow_lower=False)
    if found and follower_ok(rest[found[1] :]):
        s.turn.attribute("name", found[0], 0.8)


@rule("i_am_name", ["'m", " am", "im"], I_AM + r"\s+")
def _i_am_name(m: re.Match[str], s: Sentence) -> None:
    """ "I'm Sam": weak, so the name must be capitalised, plausible and stand alone."""
    rest = s.after(m)
    if not rest[:1].isupper():
        return
    found = take_name(rest, allow_lower=False)
    if not found:
        return
    name, end = found
    first = name.split()[0].lower()
    if first in DEMONYMS or first in LANGUAGES or first in OCCUPATIONS or first in PETS:
        return
    if s.turn.capitals_unreliable or (first.endswith("ing") and len(first) > 5):
        return
    if rest[end : end + 2] == "'s" or not follower_ok(rest[end:]):
        return
    s.turn.attribute("name", name, 0.7)


def _age(s: Sentence, raw: str, confidence: float, *, supersedes: bool = False) -> None:
    age = parse_number(raw)
    if age is not None and 5 <= age <= 120:
        s.turn.attribute("age", str(age), confidence, supersedes=supersedes)


@rule(
    "age_i_am",
    ["'m", " am", "im"],
    I_AM
    + r"\s+(?:now\s+|already\s+)?"
    + NUM
    + r"(?:\s*(?:years?|yrs?)(?:\s+|-)old|\s*(?:yo|y/o|years?\s+of\s+age))?(?![\w%'-])",
)
def _age_i_am(m: re.Match[str], s: Sentence) -> None:
    if follower_ok(s.after(m)):
        _age(s, m.group("num"), 0.85)


@rule(
    "age_turned",
    ["turned"],
    r"\bI(?:'ve|\s+have)?(?:\s+just|\s+recently)?\s+turned\s+" + NUM + r"\b",
)
def _age_turned(m: re.Match[str], s: Sentence) -> None:
    unit = re.match(r"\s*(%|percent|degrees|pages|times|minutes|hours|km|miles)", s.after(m))
    if unit is None:
        _age(s, m.group("num"), 0.85, supersedes=True)


@rule("age_my_age", ["age"], r"\bmy\s+age\s+is\s+" + NUM + r"\b")
def _age_my_age(m: re.Match[str], s: Sentence) -> None:
    _age(s, m.group("num"), 0.9)


@rule("age_year_old", ["year"], I_AM + r"\s+an?\s+" + NUM + r"[\s-]years?[\s-]old\b")
def _age_year_old(m: re.Match[str], s: Sentence) -> None:
    _age(s, m.group("num"), 0.85)


# --- Location: home and origin ----------------------------------------------------------


def _place(s: Sentence, rest: str) -> tuple[str, int] | None:
    return take_proper(rest, lowercase_mode=s.turn.lowercase_mode)


def _place_conf(s: Sentence, confidence: float) -> float:
    """Lower-case typing hides which words are names: trust the place less."""
    return confidence - 0.15 if s.turn.lowercase_mode else confidence


@rule("home_live", ["live", "resid"], r"\bI" + ADV + r"\s+(?:live|reside)\s+in\s+")
def _home_live(m: re.Match[str], s: Sentence) -> None:
    found = _place(s, s.after(m))
    if found:
        conf = _place_conf(s, 0.85)
        s.turn.attribute("home_location", found[0], conf, supersedes=states_change(m.group()))


@rule(
    "home_lived",
    ["lived", "living"],
    r"\bI(?:'ve|\s+have)\s+(?:lived|been\s+living)\s+in\s+",
)
def _home_lived(m: re.Match[str], s: Sentence) -> None:
    """ "I've lived in London all my life": only with a duration does it say "still"."""
    rest = s.after(m)
    found = _place(s, rest)
    if found and re.match(
        r"\s+(?:for|since|all\s+my\s+life|my\s+(?:whole|entire)\s+life)\b", rest[found[1] :], re.I
    ):
        s.turn.attribute("home_location", found[0], _place_conf(s, 0.8))


@rule(
    "home_based",
    ["living", "based", "located", "settled"],
    I_AM + ADV + r"\s+(?:living|based|located|settled)\s+in\s+",
)
def _home_based(m: re.Match[str], s: Sentence) -> None:
    found = _place(s, s.after(m))
    if found:
        conf = _place_conf(s, 0.8)
        s.turn.attribute("home_location", found[0], conf, supersedes=states_change(m.group()))


@rule(
    "home_moved",
    ["moved", "relocated"],
    r"\bI(?:'ve|\s+have)?" + ADV + r"\s+(?:moved|relocated)\s+(?:back\s+|over\s+|here\s+)?to\s+",
)
def _home_moved(m: re.Match[str], s: Sentence) -> None:
    found = _place(s, s.after(m))
    if found:
        s.turn.attribute("home_location", found[0], _place_conf(s, 0.85), supersedes=True)


@rule(
    "home_moved_from",
    ["moved", "relocated"],
    r"\bI(?:'ve|\s+have)?" + ADV + r"\s+(?:moved|relocated)\s+(?:here\s+|over\s+|away\s+)?from\s+",
)
def _home_moved_from(m: re.Match[str], s: Sentence) -> None:
    """ "I moved from Paris to Lisbon": Paris no longer holds, Lisbon does."""
    rest = s.after(m)
    old = _place(s, rest)
    if not old:
        return
    s.turn.attribute("home_location", old[0], _place_conf(s, 0.7), negated=True)
    to = re.match(r"\s+to\s+", rest[old[1] :], re.IGNORECASE)
    if to:
        new = _place(s, rest[old[1] + to.end() :])
        if new:
            s.turn.attribute("home_location", new[0], _place_conf(s, 0.85), supersedes=True)


@rule(
    "home_no_longer",
    ["live"],
    r"\bI\s+(?:no\s+longer|don't|do\s+not|dont|used\s+to)\s+(?:really\s+|actually\s+)?live\s+in\s+",
)
def _home_no_longer(m: re.Match[str], s: Sentence) -> None:
    found = _place(s, s.after(m))
    if found:
        conf = 0.7 if "used" in m.group().lower() else 0.8
        s.turn.attribute("home_location", found[0], _place_conf(s, conf), negated=True)


@rule("origin_from", ["from"], I_AM + r"(?:\s+originally|\s+actually|\s+also)?\s+from\s+")
def _origin_from(m: re.Match[str], s: Sentence) -> None:
    found = _place(s, s.after(m))
    if found:
        s.turn.attribute("origin", found[0], _place_conf(s, 0.8))


@rule(
    "origin_other",
    ["come from", "born", "raised", "grew up", "hometown", "home town"],
    r"\bI(?:\s+originally)?\s+come\s+from\s+|\bI\s+was\s+(?:born\s+and\s+raised|born|raised)\s+in\s+"
    r"|\bI\s+grew\s+up\s+in\s+|\bmy\s+home\s*town\s+is\s+",
)
def _origin_other(m: re.Match[str], s: Sentence) -> None:
    found = _place(s, s.after(m))
    if found:
        conf = 0.7 if "grew" in m.group().lower() else 0.8
        s.turn.attribute("origin", found[0], _place_conf(s, conf))


# --- Occupation and employer ---------------------------------------------------------------

_OCC_STOP = frozenset(
    """
    at for in with and or but from who that which by of since because so when on to like
    as here there now currently who's whose myself too
    """.split()
)
_AGE_PREFIX_RE = re.compile(r"\s*\d{1,3}[\s-]years?[\s-]old\s+", re.IGNORECASE)
_NO_EMPLOYER_HEADS = frozenset({"student", "retiree", "freelancer"})


def _is_occupation(head: str, *, broad: bool) -> bool:
    """Whether head names a job: from the lexicon, a job suffix, or (broad) an agent noun."""
    if head in NOT_OCCUPATIONS:
        return False
    if head in OCCUPATIONS or head.endswith(OCCUPATION_SUFFIXES):
        return True
    return broad and len(head) > 4 and head.endswith(("er", "or", "ant", "ent", "ian"))


def _occupation_case(words: list[str]) -> str:
    """Job titles are categorical: lower-case, except acronyms and marked case ("UX", "PhD")."""
    out = []
    for w in words:
        keep = (w.isupper() and len(w) <= 4) or any(c.isupper() for c in w[1:])
        out.append(w if keep else w.lower())
    return " ".join(out)


def _occupation_phrase(rest: str, *, broad: bool, title_only: bool) -> tuple[str, bool, int] | None:
    """Read "senior software engineer" from rest: (value, former, end) or None.

    The phrase runs to the first preposition or conjunction and must end on an
    occupation noun; a judgement word ("a good cook") or a possessive ("a
    doctor's wife") means it is not a job at all.
    """
    offset = 0
    age = _AGE_PREFIX_RE.match(rest)
    if age:
        offset = age.end()
    words = []
    for w in leading_words(rest[offset:], limit=6):
        if w.lower in _OCC_STOP:
            break
        words.append(w)
    if not words or len(words) > 4:
        return None
    if any("'" in w.text or not w.text.replace("-", "").isalpha() for w in words):
        return None
    texts = [w.text for w in words]
    former = texts[0].lower() in {"former", "ex"}
    if former:
        texts = texts[1:]
    elif texts[0].lower().startswith("ex-"):  # "an ex-teacher"
        former, texts[0] = True, texts[0][3:]
    if not texts or any(t.lower() in EVALUATIVE for t in texts):
        return None
    head = texts[-1].lower()
    if title_only and head not in TITLES:
        return None
    if not _is_occupation(head, broad=broad):
        return None
    return _occupation_case(texts), former, offset + words[-1].end


def _employer_after(s: Sentence, rest: str, head: str, *, allow_of: bool) -> None:
    """ "I'm an engineer at Google": the employer follows the job."""
    link = re.match(r"\s+(?:at|for|with)\s+" + (r"|\s+of\s+" if allow_of else ""), rest, re.I)
    if link is None or head in _NO_EMPLOYER_HEADS or s.turn.lowercase_mode:
        return
    found = take_proper(rest[link.end() :], lowercase_mode=False) or _workplace_phrase(
        rest[link.end() :]
    )
    if found:
        s.turn.attribute("employer", found[0], 0.75)


@rule("occ_i_am", ["'m", " am", "im"], I_AM + ADV + r"\s+(?P<art>an?|the)\s+")
def _occ_i_am(m: re.Match[str], s: Sentence) -> None:
    rest = s.after(m)
    title_only = m.group("art").lower() == "the"
    found = _occupation_phrase(rest, broad=False, title_only=title_only)
    if not found:
        return
    value, former, end = found
    head = value.split()[-1].lower()
    conf = 0.75 if head in OCCUPATIONS or head in TITLES else 0.6
    s.turn.attribute("occupation", value, conf, supersedes=states_change(m.group()), negated=former)
    if not former:
        _employer_after(s, rest[end:], head, allow_of=head in TITLES)


@rule(
    "occ_work_as",
    ["work", "employed"],
    r"\bI(?:'m|\s+am|'ve\s+been|\s+have\s+been)?"
    + ADV
    + r"\s+(?:work|working|employed)\s+as\s+(?:an?\s+|the\s+)?",
)
def _occ_work_as(m: re.Match[str], s: Sentence) -> None:
    rest = s.after(m)
    found = _occupation_phrase(rest, broad=True, title_only=False)
    if found:
        value, former, end = found
        s.turn.attribute(
            "occupation", value, 0.85, supersedes=states_change(m.group()), negated=former
        )
        _employer_after(s, rest[end:], value.split()[-1].lower(), allow_of=False)


@rule(
    "occ_my_job",
    ["job", "occupation", "profession", "role", "title"],
    r"\bmy\s+(?P<new>current\s+|new\s+|day\s+)?(?:job|occupation|profession|role|job\s+title)\s+is\s+"
    r"(?:an?\s+|the\s+)?",
)
def _occ_my_job(m: re.Match[str], s: Sentence) -> None:
    rest = s.after(m)
    found = _occupation_phrase(rest, broad=True, title_only=False)
    if found:
        value, former, end = found
        new = (m.group("new") or "").strip().lower() == "new"
        s.turn.attribute("occupation", value, 0.85, supersedes=new, negated=former)
        _employer_after(s, rest[end:], value.split()[-1].lower(), allow_of=False)


@rule(
    "occ_negated",
    ["not", "no longer", "used to be"],
    I_AM + r"\s+(?:not|no\s+longer)\s+(?:an?\s+|the\s+)?|\bI\s+used\s+to\s+be\s+(?:an?\s+|the\s+)",
)
def _occ_negated(m: re.Match[str], s: Sentence) -> None:
    found = _occupation_phrase(s.after(m), broad=False, title_only=False)
    if found:
        conf = 0.6 if "used" in m.group().lower() else 0.7
        s.turn.attribute("occupation", found[0], conf, negated=True)


@rule(
    "occ_status",
    ["retired", "unemployed", "self-employed", "between jobs", "out of work", "retiree"],
    I_AM
    + ADV
    + r"\s+(?P<status>retired|unemployed|self-employed|between\s+jobs|out\s+of\s+work)(?![\w-])",
)
def _occ_status(m: re.Match[str], s: Sentence) -> None:
    status = " ".join(m.group("status").lower().split())
    if status == "self-employed":
        s.turn.attribute("employer", "self-employed", 0.8)
        return
    if status == "retired" and not follower_ok(s.after(m)):
        if not re.match(r"\s+(?:from|since|after|in|last)\b", s.after(m), re.IGNORECASE):
            return  # "I'm retired teacher"-like run-ons are left to the occupation rule
    value = "retired" if status == "retired" else "unemployed"
    s.turn.attribute("occupation", value, 0.8, supersedes=True)


_WORK_VERB = r"\bI(?:'m|\s+am|'ve\s+been|\s+have\s+been)?" + ADV + r"\s+(?:work|working|employed)"


@rule("emp_work_at", ["work", "employed"], _WORK_VERB + r"\s+(?:at|for)\s+")
def _emp_work_at(m: re.Match[str], s: Sentence) -> None:
    rest = s.after(m)
    if re.match(r"(?:myself|my\s+own\s+(?:company|business))\b", rest, re.I):
        s.turn.attribute("employer", "self-employed", 0.8)
        return
    if s.turn.lowercase_mode:
        return  # organisation names are unrecognisable without capitals
    found = take_proper(rest, lowercase_mode=False)
    if found:
        s.turn.attribute("employer", found[0], 0.8, supersedes=states_change(m.group()))


@rule(
    "emp_new_job",
    ["job", "position", "role", "internship", "started"],
    r"\bI(?:'ve|\s+have)?(?:\s+just|\s+finally|\s+recently)?\s+(?:got|landed|accepted|started|took)\s+"
    r"(?:a\s+|an\s+|the\s+|my\s+)?(?:new\s+)?(?:job|position|role|internship)\s+(?:at|with)\s+"
    r"|\bI(?:\s+just|\s+recently)?\s+started\s+(?:working\s+)?(?:at|for)\s+",
)
def _emp_new_job(m: re.Match[str], s: Sentence) -> None:
    if s.turn.lowercase_mode:
        return
    found = take_proper(s.after(m), lowercase_mode=False)
    if found:
        s.turn.attribute("employer", found[0], 0.8, supersedes=True)


@rule(
    "emp_negated",
    ["work", "quit", "left", "fired", "laid off", "let go"],
    r"\bI\s+(?:no\s+longer|don't|do\s+not|dont|used\s+to)\s+work\s+(?:at|for)\s+"
    r"|\bI(?:\s+just)?\s+(?:quit|left)\s+my\s+job\s+(?:at|with)\s+"
    r"|\bI\s+(?:got|was|have\s+been|'ve\s+been)\s+(?:fired|laid\s+off|let\s+go)\s+(?:from|by)\s+",
)
def _emp_negated(m: re.Match[str], s: Sentence) -> None:
    if s.turn.lowercase_mode:
        return
    found = take_proper(s.after(m), lowercase_mode=False)
    if found:
        s.turn.attribute("employer", found[0], 0.75, negated=True)


# --- Language --------------------------------------------------------------------------

_LANG_TOKEN_RE = re.compile(r"[A-Za-z]+|[,&/]")
_LANG_GLUE = frozenset(
    """
    , & / and or plus some a little bit of fluent basic native conversational decent good
    perfect broken also both
    """.split()
)


def languages_in(text: str, limit: int = 6) -> list[str]:
    """Language names at the start of text: "English, Spanish and a bit of French"."""
    found: list[str] = []
    for t in _LANG_TOKEN_RE.finditer(text):
        word = t.group().lower()
        if word in LANGUAGES:
            name = word.upper() if word == "asl" else word.capitalize()
            if name not in found:
                found.append(name)
            if len(found) >= limit:
                break
        elif word not in _LANG_GLUE:
            break
    return found


@rule(
    "lang_speak",
    ["speak"],
    r"\bI" + ADV + r"\s+(?:can\s+)?speak\s+"
    r"(?P<lvl>(?:fluent|some|a\s+little|a\s+bit\s+of|basic|native|good|decent|conversational|"
    r"broken|perfect)\s+)?",
)
def _lang_speak(m: re.Match[str], s: Sentence) -> None:
    level = (m.group("lvl") or "").strip().lower()
    if level in {"fluent", "native", "perfect"}:
        conf = 0.9
    elif level in {"", "good", "decent", "conversational"}:
        conf = 0.8
    else:
        conf = 0.6
    for name in languages_in(s.after(m)):
        s.turn.attribute("language", name, conf)


@rule(
    "lang_fluent",
    [
        "fluent",
        "bilingual",
        "trilingual",
        "proficient",
        "conversational",
        "native",
        "language",
        "tongue",
    ],
    I_AM + ADV + r"\s+(?:fluent|conversational|proficient|bilingual|trilingual|native)\s+in\s+"
    r"|\bmy\s+(?:native|first|mother|main)\s+(?:language|tongue)\s+is\s+",
)
def _lang_fluent(m: re.Match[str], s: Sentence) -> None:
    for name in languages_in(s.after(m)):
        s.turn.attribute("language", name, 0.9)


@rule(
    "lang_native_speaker",
    ["speaker", "language", "tongue"],
    I_AM + r"\s+an?\s+native\s+(?P<lang>[a-z]+)\s+speaker\b"
    r"|\b(?P<lang2>[a-z]+)\s+is\s+my\s+(?:native|first|mother|main|second|third|other)\s+"
    r"(?:language|tongue)\b",
)
def _lang_native_speaker(m: re.Match[str], s: Sentence) -> None:
    for name in languages_in(m.group("lang") or m.group("lang2")):
        s.turn.attribute("language", name, 0.9)


@rule(
    "lang_negated",
    ["speak"],
    r"\bI\s+(?:don't|do\s+not|dont|can't|cannot|can\s+not|no\s+longer)\s+(?:really\s+|actually\s+)?"
    r"speak\s+(?:any\s+)?",
)
def _lang_negated(m: re.Match[str], s: Sentence) -> None:
    for name in languages_in(s.after(m)):
        s.turn.attribute("language", name, 0.8, negated=True)


# --- Common-noun places, schools, workplaces, age ranges ---------------------------------

_PLACE_ADJ = r"(?:(?:small|big|tiny|quiet|little|large|busy|rural|remote)\s+)?"
_PLACE_NOUN = "|".join(sorted(HOME_PLACES, key=len, reverse=True))
_WATER = r"ocean|sea|beach|lake|river|coast|mountains|bay"


@rule(
    "home_common_place",
    ["live", "grew up", "raised"],
    r"\bI" + ADV + r"\s+(?P<verb>live|grew\s+up|was\s+raised)\s+"
    r"(?:(?P<prep>in|on|by|near|at)\s+)(?P<place>(?:an?\s+|the\s+)?"
    r"(?P<noun>" + _PLACE_ADJ + r"(?:" + _PLACE_NOUN + "|" + _WATER + r")))(?![\w-])",
)
def _home_common_place(m: re.Match[str], s: Sentence) -> None:
    """ "I live on a farm", "I live by the ocean", "I grew up on the beach"."""
    prep = m.group("prep").lower()
    noun = m.group("noun").lower().split()[-1]
    if prep in {"by", "near"}:
        if noun not in _WATER.split("|"):
            return  # "I live near a town" says little
        value = f"{prep} the {noun}"
    elif noun in _WATER.split("|") and prep != "on":
        return  # "I live in the sea"? not a home
    else:
        value = " ".join(m.group("noun").lower().split())
    key = "home_location" if m.group("verb").lower() == "live" else "origin"
    s.turn.attribute(key, value, 0.7, supersedes=states_change(m.group()))


_SCHOOLS = {
    "college": "college student",
    "university": "university student",
    "uni": "university student",
    "grad school": "graduate student",
    "graduate school": "graduate student",
    "high school": "high school student",
    "highschool": "high school student",
    "middle school": "middle school student",
    "law school": "law student",
    "med school": "medical student",
    "medical school": "medical student",
    "nursing school": "nursing student",
    "school": "student",
}
_SCHOOL = "|".join(
    sorted((re.escape(k).replace("\\ ", r"\s+") for k in _SCHOOLS), key=len, reverse=True)
)


@rule(
    "student_in",
    ["college", "universit", "uni", "school"],
    r"(?:" + I_AM + r"|\bwho\s+(?:is|am))" + ADV + r"\s+(?:in|at|attending|going\s+to)\s+"
    r"(?:the\s+|a\s+)?(?P<school>" + _SCHOOL + r")(?![\w-])",
)
def _student_in(m: re.Match[str], s: Sentence) -> None:
    """ "I am in college", "a girl who is still in highschool": a student."""
    if m.group().lower().startswith("who") and not re.match(I_AM, s.text, re.IGNORECASE):
        return  # "who is in college" belongs to the user only in "I'm a girl who ..."
    school = " ".join(m.group("school").lower().split())
    s.turn.attribute("occupation", _SCHOOLS[school], 0.75)


@rule(
    "student_of",
    ["major", "studying", "study", "degree"],
    r"\bI(?:'m|\s+am)?\s+(?:currently\s+|now\s+)?(?:majoring\s+in|studying(?:\s+for)?|"
    r"study|doing\s+a\s+degree\s+in|getting\s+a\s+degree\s+in)\s+"
    r"(?:an?\s+(?:degree|major|masters?|phd|ba|bs)\s+in\s+)?",
)
def _student_of(m: re.Match[str], s: Sentence) -> None:
    """ "I am majoring in music therapy" -> "music therapy student"."""
    rest = s.after(m)
    if re.match(r"(?:to|for|with|at|hard|a\s+lot|abroad|every|all)\b", rest, re.IGNORECASE):
        return  # "studying to be a nurse" is a plan; "study hard" says nothing
    words = []
    for w in leading_words(cut_clause(rest), limit=5):
        if w.lower in _OCC_STOP or not w.text.replace("-", "").isalpha():
            break
        words.append(w.lower)
    # "a music degree" -> "music": the subject, not the qualification.
    if words and words[0] in {"a", "an", "the"}:
        words = words[1:]
    while words and words[-1] in {"degree", "major", "course", "courses", "class", "classes"}:
        words.pop()
    if not words or len(words) > 3:
        return
    s.turn.attribute("occupation", " ".join(words) + " student", 0.7)


#: Words that may follow a workplace phrase ("a store near my home", "a bank downtown").
_AFTER_WORKPLACE = frozenset("near nearby downtown where called named as".split())


def _workplace_phrase(rest: str) -> tuple[str, int] | None:
    """ "a video game company" -> ("video game company", end) when it ends on a workplace."""
    art = re.match(r"(?:an?|the)\s+", rest, re.IGNORECASE)
    offset = art.end() if art else 0
    words = []
    for w in leading_words(rest[offset:], limit=6):
        if w.lower in _OCC_STOP or w.lower in _AFTER_WORKPLACE:
            break
        words.append(w)
    # The phrase must end on the workplace noun: "the business sector" is no business.
    if not words or words[-1].lower not in WORKPLACES or len(words) > 4:
        return None
    if any(not w.text.replace("-", "").replace("'", "").isalpha() for w in words):
        return None
    return " ".join(w.lower for w in words), offset + words[-1].end


@rule(
    "emp_workplace",
    ["work", "employed"],
    _WORK_VERB + r"\s+(?:at|for|in)\s+(?=(?:an?|the)\s|(?-i:[a-z]))",
)
def _emp_workplace(m: re.Match[str], s: Sentence) -> None:
    """ "I work for a video game company", "I work in the zoo as a zoo keeper"."""
    rest = s.after(m)
    found = _workplace_phrase(rest)
    if found is None:
        return
    value, end = found
    s.turn.attribute("employer", value, 0.7, supersedes=states_change(m.group()))
    as_job = re.match(r"\s+as\s+(?:an?\s+|the\s+)?", rest[end:], re.IGNORECASE)
    if as_job:
        job = _occupation_phrase(rest[end + as_job.end() :], broad=True, title_only=False)
        if job and not job[1]:
            s.turn.attribute("occupation", job[0], 0.8)


@rule(
    "occ_field",
    ["work"],
    r"\bI" + ADV + r"\s+work\s+(?:in|for)\s+(?:the\s+)?(?P<what>[a-z]+(?:\s+[a-z]+)??)"
    r"(?P<noun>\s+(?:industry|sector|field|business))?(?![\w-])",
)
def _occ_field(m: re.Match[str], s: Sentence) -> None:
    """ "I work in marketing", "I work in the business sector"."""
    what = " ".join(m.group("what").lower().split())
    if m.group("noun"):
        s.turn.attribute("occupation", f"{what} {m.group('noun').strip().lower()}", 0.65)
    elif what in WORK_FIELDS and follower_ok(s.after(m)):
        s.turn.attribute("occupation", what if what != "it" else "IT", 0.7)


_PAST_TIME_RE = re.compile(
    r"\b(?:in\s+(?:high\s+school|college|school|my\s+twenties|my\s+youth)|as\s+an?\s+"
    r"(?:kid|teen|teenager|student)|when\s+I\s+was|years\s+ago|back\s+then|in\s+the\s+past|"
    r"before\s+I)\b",
    re.IGNORECASE,
)


@rule("emp_worked_past", ["worked"], r"\bI\s+(?:once\s+)?worked\s+(?:at|for)\s+")
def _emp_worked_past(m: re.Match[str], s: Sentence) -> None:
    """ "In high school I worked at Red Lobster": a former employer, not the current one."""
    if _PAST_TIME_RE.search(s.text) is None or s.turn.lowercase_mode:
        return
    found = take_proper(s.after(m), lowercase_mode=False)
    if found:
        s.turn.attribute("employer", found[0], 0.6, negated=True)


_DECADES = r"teens|twenties|thirties|forties|fifties|sixties|seventies|eighties|nineties|\d0s"


@rule(
    "age_range",
    ["over", "under", "almost", "nearly", "in my", "aged", "age"],
    I_AM + r"\s+(?P<rel>over|under|almost|nearly)\s+" + NUM + r"(?![\w%'-])"
    r"|" + I_AM + r"\s+in\s+my\s+(?P<part>early\s+|mid\s+|late\s+)?(?P<decade>" + _DECADES + r")\b"
    r"|" + I_AM + r"\s+(?P<middle>middle[\s-]aged)\b",
)
def _age_range(m: re.Match[str], s: Sentence) -> None:
    """ "I am over 35", "I'm in my forties", "I am middle aged": an age range."""
    if m.group("middle"):
        s.turn.attribute("age", "middle-aged", 0.7)
    elif m.group("decade"):
        part = (m.group("part") or "").strip().lower()
        s.turn.attribute("age", f"{part} {m.group('decade').lower()}".strip(), 0.75)
    else:
        n = parse_number(m.group("num"))
        if n is not None and 5 <= n <= 120 and follower_ok(s.after(m)):
            s.turn.attribute("age", f"{m.group('rel').lower()} {n}", 0.7)


PERSON_RULES: tuple[Rule, ...] = (
    _name_is,
    _name_is_not,
    _call_me,
    _i_am_name,
    _age_i_am,
    _age_turned,
    _age_my_age,
    _age_year_old,
    _home_live,
    _home_lived,
    _home_based,
    _home_moved,
    _home_moved_from,
    _home_no_longer,
    _origin_from,
    _origin_other,
    _occ_i_am,
    _occ_work_as,
    _occ_my_job,
    _occ_negated,
    _occ_status,
    _emp_work_at,
    _emp_new_job,
    _emp_negated,
    _lang_speak,
    _lang_fluent,
    _lang_native_speaker,
    _lang_negated,
    _home_common_place,
    _student_in,
    _student_of,
    _emp_workplace,
    _occ_field,
    _emp_worked_past,
    _age_range,
)
