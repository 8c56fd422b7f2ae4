"""Attribute rules about tastes and food: likes, dislikes, diet, allergies."""

from __future__ import annotations

import re

from uprof.adapters.extraction.attr_common import follower_ok, states_change
from uprof.adapters.extraction.engine import ADV, I_AM, NEG, Rule, Sentence, rule
from uprof.adapters.extraction.inflect import is_gerund, to_gerund
from uprof.adapters.extraction.lexicon import AVOIDED_FOODS, DIETS, PRONOUN_OBJECTS, REQUEST_VERBS
from uprof.adapters.extraction.text import (
    CLAUSE_CUT_RE,
    categorical,
    clean,
    cut_clause,
    first_to_lower,
    leading_words,
)

# --- Likes and dislikes ----------------------------------------------------------------

#: Where a list of liked things stops: like CLAUSE_CUT_RE, but commas and "and" are kept.
_LIST_CUT_RE = re.compile(
    r"\s*(?:[;:!?()\[\]\"]|\.(?:\s|$)|\s-\s|\u2014)"
    r"|,?\s+(?:but|because|since|so|though|although|while|whereas|unless|if|cause|cuz|"
    r"except|lol|haha|btw|which|who|when|whenever|where|until|especially|like|than|"
    r"rather|over|instead|anymore|nowadays|these\s+days|too|as\s+well)\b"
    r"|,?\s+(?:and|or|then)\s+(?:I|i|I'm|i'm|im|my|we|he|she|they|it|then|now|also|you|"
    r"that|this|still|not)\b"
    r"|,\s*(?:I|i|my|we|he|she|they|it|you|that|this|not|yet|so|but|though|and\s+I)\b",
    re.IGNORECASE,
)
_LIST_SPLIT_COMMA_RE = re.compile(r"\s*,\s*(?:and\s+|or\s+|&\s+)?")
_LIST_SPLIT_AND_RE = re.compile(r"\s+(?:and|or|&|plus)\s+", re.IGNORECASE)
_IDIOMS = frozenset(
    """
    rock_and_roll fish_and_chips mac_and_cheese macaroni_and_cheese salt_and_pepper
    black_and_white bread_and_butter hide_and_seek dungeons_and_dragons pros_and_cons
    peanut_butter_and_jelly rhythm_and_blues drum_and_bass law_and_order sweet_and_sour
    arts_and_crafts
    """.split()
)
#: Objects that are a reaction to the conversation rather than a lasting taste.
_META_NOUNS = frozenset(
    """
    idea suggestion one answer response way plan question thought point part fact feeling
    approach option first second last both all most more less much lot thanks help advice
    sound look list result results output reply explanation
    """.split()
)
_ARTICLE_RE = re.compile(r"^(?:the|a|an|some)\s+(?=[a-z])", re.IGNORECASE)
_ROUTINE_IN_ITEM_RE = re.compile(
    r"\s+(?:every|each)\s+\w+$|\s+on\s+(?:weekends|weekdays|\w+days?)"
    r"(?:\s+(?:mornings|evenings|nights|afternoons))?$|\s+(?:daily|weekly)$",
    re.IGNORECASE,
)
_NOT_TASTE_STARTS = frozenset(
    "my to not no about for with at in on of from by as because if since so".split()
)
_NOT_A_TASTE_VERBS = REQUEST_VERBS | {"think", "believe", "imagine", "hope", "keep", "make"}


def list_items(rest: str, *, split_plain_and: bool = True) -> list[str]:
    """Split "hiking, swimming and reading" into items; keep "rock and roll" whole."""
    cut = _LIST_CUT_RE.search(rest)
    clause = rest[: cut.start()] if cut else rest
    clause = clean(clause)
    if not clause:
        return []
    parts = _LIST_SPLIT_COMMA_RE.split(clause)
    if len(parts) > 1:
        items: list[str] = []
        for part in parts:
            items.extend(_LIST_SPLIT_AND_RE.split(part))
        return [p for p in items if p]
    if not split_plain_and or "_".join(clause.lower().split()) in _IDIOMS:
        return [clause]
    pieces = _LIST_SPLIT_AND_RE.split(clause)
    if len(pieces) > 1 and all(0 < len(p.split()) <= 3 for p in pieces):
        return pieces
    return [clause]


def taste_value(item: str) -> str | None:
    """Normalise one liked or disliked thing; None when it is not a lasting taste."""
    item = clean(item)
    item = _ROUTINE_IN_ITEM_RE.sub("", item)
    words = item.split()
    if not words or len(words) > 6:
        return None
    if words[0].lower() == "to" and len(words) > 1:
        if words[1].lower() in _NOT_A_TASTE_VERBS:
            return None
        words = [to_gerund(words[1]), *words[2:]]
    first = words[0].lower()
    # "In n Out", "On the Road": a capitalised title may open with a preposition.
    title = len(words) > 1 and words[0][:1].isupper() and words[-1][:1].isupper()
    if first in PRONOUN_OBJECTS or (first in _NOT_TASTE_STARTS and not title):
        return None
    if any(w in {"I", "I'm", "i", "i'm", "I've", "you"} for w in words):
        return None
    item = _ARTICLE_RE.sub("", " ".join(words))
    if not item or item.split()[0].lower() in _META_NOUNS:
        return None
    return categorical(item)


def _tastes(s: Sentence, key: str, rest: str, confidence: float, *, negated: bool = False) -> None:
    infinitive = False
    for item in list_items(rest):
        words = item.split()
        # "to watch and play soccer": "play soccer" shares the "to" of the first item.
        if infinitive and words and words[0].lower() in _SECOND_VERBS:
            item = "to " + item
        infinitive = bool(words) and words[0].lower() == "to"
        for part in _infinitive_parts(item):
            value = taste_value(part)
            if not value:
                continue
            s.turn.attribute(key, value, confidence, negated=negated)
            if key == "likes" and not negated and _ROUTINE_IN_ITEM_RE.search(clean(part)):
                # "I like watching movies on Sunday evenings": a taste and a habit.
                words = clean(part).split()
                if words[0].lower() == "to" and len(words) > 1:
                    words = [to_gerund(words[1]), *words[2:]]
                s.turn.attribute("routine", first_to_lower(" ".join(words)), 0.6)


#: Verbs that open the second half of "to go to the park and hang out with friends".
_SECOND_VERBS = frozenset(
    """
    go hang spend watch play read eat cook travel visit listen take make meet walk run ride
    sleep relax chill explore shop try learn see drink dance sing paint draw write swim
    hike fish bake camp garden crochet knit sew ski surf skate bike cycle
    """.split()
)


def _infinitive_parts(item: str) -> list[str]:
    """ "to go to the park and hang out" -> ["to go to the park", "to hang out"]."""
    words = clean(item).split()
    if len(words) < 4 or words[0].lower() != "to":
        return [item]
    parts: list[list[str]] = [[]]
    for i, w in enumerate(words):
        if w.lower() == "and" and i + 1 < len(words) and words[i + 1].lower() in _SECOND_VERBS:
            parts.append(["to"])
            continue
        parts[-1].append(w)
    return [" ".join(p) for p in parts if len(p) > 1]


@rule(
    "likes",
    ["love", "like", "enjoy", "adore", "prefer"],
    r"\bI" + ADV + r"\s+(?P<verb>love|like|enjoy|adore|prefer)\s+",
)
def _likes(m: re.Match[str], s: Sentence) -> None:
    if re.search(r"\b(?:what|which|things?|everything|stuff)\s*$", s.before(m), re.I):
        return  # "what I like about it is ...": the object is not where the rule looks
    verb = m.group("verb").lower()
    conf = {"love": 0.8, "adore": 0.8, "like": 0.75, "enjoy": 0.75}.get(verb, 0.65)
    _tastes(s, "likes", s.after(m), conf)


@rule(
    "likes_into",
    [
        "into",
        "fan",
        "fond",
        "passionate",
        "obsessed",
        "crazy",
        "keen",
        "mad about",
        "addicted",
        "hooked",
    ],
    I_AM + ADV + r"\s+(?:into|an?\s+(?:big\s+|huge\s+|great\s+|massive\s+)?fan\s+of|fond\s+of|"
    r"passionate\s+about|obsessed\s+with|crazy\s+about|keen\s+on|mad\s+about|addicted\s+to|"
    r"hooked\s+on)\s+",
)
def _likes_into(m: re.Match[str], s: Sentence) -> None:
    _tastes(s, "likes", s.after(m), 0.75)


_FAV = r"(?:favou?rite|fav|fave)"


@rule(
    "favourite",
    ["fav"],
    r"\bmy\s+(?:absolute\s+|all[\s-]time\s+)?"
    + _FAV
    + r"\s+(?P<what>[a-z]+(?:\s+[a-z]+){0,2}?)(?:\s+in\s+school)?\s+"
    r"(?:is|are|was|were|has\s+to\s+be|would\s+be)\s+",
)
def _favourite(m: re.Match[str], s: Sentence) -> None:
    what = m.group("what").lower()
    for item in list_items(s.after(m)):
        value = taste_value(item)
        if not value:
            continue
        if what.split()[0] not in {"thing", "things", "one", "ones"}:
            value = f"favourite {what}: {value}"
        s.turn.attribute("likes", value, 0.85)


@rule(
    "favourite_reverse",
    ["fav"],
    r"\s+(?:is|are)\s+(?:probably\s+|definitely\s+|still\s+)?my\s+(?:absolute\s+|all[\s-]time\s+)?"
    + _FAV
    + r"(?:\s+(?P<what>[a-z]+))?\b",
)
def _favourite_reverse(m: re.Match[str], s: Sentence) -> None:
    """ "Pizza is my favourite food": the value comes before the trigger."""
    prefix = s.before(m)
    start = 0
    for b in CLAUSE_CUT_RE.finditer(prefix):
        start = b.end()
    words = prefix[start:].split()
    if not words or len(words) > 4:
        return
    phrase = " ".join(words)
    if start == 0 and s.starts_sentence(prefix, m) and len(words) == 1:
        phrase = first_to_lower(phrase)  # sentence-initial capital is not a proper noun
    value = taste_value(phrase)
    if not value:
        return
    what = (m.group("what") or "").lower()
    if what and what not in {"by", "of", "and", "but", "too", "so", "ever", "thing", "one"}:
        value = f"favourite {what}: {value}"
    s.turn.attribute("likes", value, 0.85)


@rule(
    "hobbies",
    ["hobb", "free time", "spare time"],
    r"\bmy\s+(?:main\s+|favou?rite\s+)?hobb(?:y|ies)\s+(?:is|are|include|includes)\s+"
    r"|\bin\s+my\s+(?:free|spare)\s+time,?\s+I"
    + ADV
    + r"\s+(?:like\s+to\s+|love\s+to\s+|enjoy\s+)?",
)
def _hobbies(m: re.Match[str], s: Sentence) -> None:
    verb_form = m.group().lower().startswith("in")
    for item in list_items(s.after(m)):
        words = clean(item).split()
        if verb_form and words:
            # "In my free time I go hiking" -> "hiking"; "I paint" -> "painting".
            if words[0].lower() == "go" and len(words) > 1 and is_gerund(words[1]):
                words = words[1:]
            words = [to_gerund(words[0]), *words[1:]]
        value = taste_value(" ".join(words))
        if value:
            s.turn.attribute("likes", value, 0.8 if not verb_form else 0.65)


@rule(
    "dislikes",
    ["hate", "dislike", "detest", "loathe", "despise", "stand", "bear", "care for"],
    r"\bI" + ADV + r"\s+(?:hate|dislike|detest|loathe|despise|can't\s+stand|cannot\s+stand|"
    r"can\s+not\s+stand|can't\s+bear|cannot\s+bear|don't\s+care\s+for|do\s+not\s+care\s+for)\s+",
)
def _dislikes(m: re.Match[str], s: Sentence) -> None:
    _tastes(s, "dislikes", s.after(m), 0.8)


@rule(
    "dislikes_negated_like",
    ["like", "enjoy"],
    r"\bI"
    + ADV
    + r"\s+(?:"
    + NEG
    + ADV
    + r"\s+(?:like|enjoy)|never"
    + ADV
    + r"\s+(?:liked|enjoyed))\s+",
)
def _dislikes_negated_like(m: re.Match[str], s: Sentence) -> None:
    """ "I don't like olives" -> dislikes; "... anymore" only withdraws a like."""
    rest = s.after(m)
    clause = cut_clause(rest)
    if re.search(r"\b(?:anymore|any\s+more)\b", clause, re.IGNORECASE):
        _tastes(s, "likes", rest, 0.75, negated=True)
    else:
        _tastes(s, "dislikes", rest, 0.75)


@rule(
    "likes_no_longer",
    ["no longer", "not", "used to"],
    r"\bI\s+(?:no\s+longer|used\s+to)\s+(?:like|love|enjoy)\s+"
    r"|"
    + I_AM
    + r"\s+(?P<nl>no\s+longer|not\s+(?:really\s+)?)(?:into|an?\s+(?:big\s+|huge\s+)?fan\s+of|"
    r"fond\s+of|keen\s+on)\s+",
)
def _likes_no_longer(m: re.Match[str], s: Sentence) -> None:
    nl = (m.group("nl") or "").lower()
    rest = s.after(m)
    if nl.startswith("not") and not re.search(r"\banymore\b", cut_clause(rest), re.I):
        _tastes(s, "dislikes", rest, 0.65)  # "I'm not a fan of jazz"
    else:
        _tastes(s, "likes", rest, 0.75, negated=True)


# --- Diet and allergies -------------------------------------------------------------------

_DIET = "|".join(sorted((re.escape(k) for k in DIETS), key=len, reverse=True))
_DIET_GUARDS = (
    "vegan",
    "vegetarian",
    "veggie",
    "pesc",
    "keto",
    "paleo",
    "halal",
    "kosher",
    "free",
    "plant",
    "flexitarian",
    "carnivore",
    "meat",
    "omnivore",
)


@rule(
    "diet_i_am",
    _DIET_GUARDS,
    I_AM + ADV + r"\s+(?:an?\s+|strictly\s+|fully\s+|(?P<mostly>mostly|mainly)\s+|100%\s+)?"
    r"(?P<diet>" + _DIET + r")(?![\w-])",
)
def _diet_i_am(m: re.Match[str], s: Sentence) -> None:
    if not follower_ok(s.after(m)):
        return  # "I'm a vegan chef" says what they cook, not what they eat
    conf = 0.7 if m.group("mostly") else 0.9
    diet = DIETS[m.group("diet").lower()]
    s.turn.attribute("diet", diet, conf, supersedes=states_change(m.group()))


@rule(
    "diet_verb",
    _DIET_GUARDS,
    r"\bI(?:'m|\s+am|'ve|\s+have)?"
    + ADV
    + r"\s+(?P<verb>on\s+an?|follow\s+an?|following\s+an?|eat|keep|went|gone|"
    r"switched\s+to(?:\s+an?)?|became|become|turned)\s+"
    r"(?P<diet>" + _DIET + r")(?P<noun>\s+diet)?(?![\w-])",
)
def _diet_verb(m: re.Match[str], s: Sentence) -> None:
    verb = m.group("verb").lower().split()[0]
    change = verb in {"went", "gone", "switched", "became", "become", "turned"}
    if not (m.group("noun") or change) and not follower_ok(s.after(m)):
        return  # "I eat vegan food sometimes" is a habit, not a diet
    diet = DIETS[m.group("diet").lower()]
    s.turn.attribute("diet", diet, 0.85, supersedes=change or states_change(m.group()))


@rule(
    "diet_negated",
    _DIET_GUARDS,
    I_AM + r"\s+(?:not|no\s+longer)\s+(?:an?\s+)?(?P<diet>" + _DIET + r")(?![\w-])"
    r"|\bI\s+(?:stopped|quit)\s+being\s+(?:an?\s+)?(?P<diet2>" + _DIET + r")(?![\w-])",
)
def _diet_negated(m: re.Match[str], s: Sentence) -> None:
    diet = DIETS[(m.group("diet") or m.group("diet2")).lower()]
    s.turn.attribute("diet", diet, 0.8, negated=True)


@rule(
    "diet_avoid",
    ["eat", "avoid"],
    r"\bI"
    + ADV
    + r"\s+(?:(?P<neg>don't|do\s+not|dont|never|no\s+longer|can't|cannot)"
    + ADV
    + r"\s+eat|avoid)\s+(?:any\s+)?",
)
def _diet_avoid(m: re.Match[str], s: Sentence) -> None:
    words = [w.lower for w in leading_words(s.after(m), limit=3)]
    for n in (2, 1):
        food = " ".join(words[:n])
        if len(words) >= n and food in AVOIDED_FOODS:
            change = "longer" in (m.group("neg") or "").lower()
            s.turn.attribute("diet", AVOIDED_FOODS[food], 0.75, supersedes=change)
            return


def _allergens(s: Sentence, rest: str, confidence: float, *, negated: bool = False) -> None:
    for item in list_items(rest):
        value = taste_value(item)
        if value:
            s.turn.attribute("allergy", value.lower(), confidence, negated=negated)


@rule(
    "allergic",
    ["allerg"],
    I_AM
    + r"(?P<neg>\s+not)?"
    + ADV
    + r"\s+(?:severely\s+|very\s+|highly\s+|deathly\s+|mildly\s+|slightly\s+)?allergic\s+to\s+"
    r"|\b(?:I\s+have\s+an?|my)\s+(?:severe\s+|mild\s+|serious\s+)?allergy\s+to\s+",
)
def _allergic(m: re.Match[str], s: Sentence) -> None:
    negated = bool(m.groupdict().get("neg"))
    _allergens(s, s.after(m), 0.8 if negated else 0.9, negated=negated)


_NOT_ALLERGENS = frozenset(
    {"a", "an", "some", "bad", "few", "many", "seasonal", "food", "terrible"}
)


@rule(
    "allergy_have",
    ["allerg"],
    r"\bI\s+have\s+(?:an?\s+)?(?:severe\s+|mild\s+|serious\s+|bad\s+|slight\s+)?"
    r"(?P<what>[a-z]+(?:\s+[a-z]+)?)\s+allerg(?:y|ies)\b",
)
def _allergy_have(m: re.Match[str], s: Sentence) -> None:
    what = m.group("what").lower()
    if what.split()[-1] in _NOT_ALLERGENS or what.split()[0] in _NOT_ALLERGENS:
        return
    s.turn.attribute("allergy", what, 0.85)


@rule(
    "intolerant",
    ["intoleran", "celiac", "coeliac"],
    I_AM + ADV + r"\s+(?P<what>lactose|gluten|dairy|fructose|histamine)[\s-]intolerant\b"
    r"|\bI(?:'m|\s+am|\s+have)\s+(?P<celiac>celiac|coeliac)(?:\s+disease)?\b"
    r"|\bI\s+have\s+(?:an?\s+)?(?P<what2>lactose|gluten|dairy|fructose|histamine)\s+intolerance\b",
)
def _intolerant(m: re.Match[str], s: Sentence) -> None:
    what = m.group("what") or m.group("what2") or "gluten"
    s.turn.attribute("allergy", what.lower(), 0.85)


#: Pastimes stated by doing them ("I collect comic books", "I sing"): base form -> kept.
_PASTIME_VERBS = (
    "collect|play|sing|dance|paint|draw|knit|sew|crochet|hike|fish|surf|ski|snowboard|swim|"
    "bake|garden|sail|skate|skateboard|camp|hunt|golf|jog|bowl|climb|read|write|watch|cook|"
    "bike|cycle|ride|volunteer|blog|quilt|sculpt|skydive|kayak|row|box|fence|meditate"
)
_OFTEN = r"often|frequently|regularly|usually|always|sometimes|also|still|really|mostly"
#: Objects that make the verb a chore or a role, not a pastime ("I play a role", "I watch my kids").
_NOT_PASTIME_OBJECTS = frozenset(
    """
    a an my his her their your our it them him me us this that these those out up down
    role part game games with along against for to back over around
    """.split()
)


#: How often, at the end of a pastime ("I cook stew often"): not part of the taste.
_TRAILING_OFTEN_RE = re.compile(
    r"\s*\b(?:often|a\s+lot|sometimes|regularly|everyday|every\s+day|daily|a\s+little)$",
    re.IGNORECASE,
)


@rule(
    "pastime",
    [*_PASTIME_VERBS.split("|"), "eat"],
    r"\bI(?P<often>(?:\s+(?:" + _OFTEN + r"))*)\s+(?P<verb>(?:" + _PASTIME_VERBS + r")|eat)"
    r"(?![\w'-])",
)
def _pastime(m: re.Match[str], s: Sentence) -> None:
    """ "I collect comic books" -> likes "collecting comic books": a weak cue, so 0.6."""
    verb = m.group("verb").lower()
    if verb == "eat" and not m.group("often").strip():
        return  # "I eat meat" is a diet cue at most; "I frequently eat BBQ" is a taste
    rest = s.after(m)
    clause = cut_clause(rest)
    words = clean(clause).split()
    if words and (words[0].lower() in _NOT_PASTIME_OBJECTS or words[0].lower() in PRONOUN_OBJECTS):
        if not (verb in {"play", "watch", "read"} and words[0].lower() in {"a", "an"} and False):
            return
    if len(words) > 6:
        return
    object_ = _TRAILING_OFTEN_RE.sub("", " ".join(words))
    value = taste_value(object_ if verb == "eat" else f"{to_gerund(verb)} {object_}".strip())
    if value:
        s.turn.attribute("likes", value, 0.6)


@rule(
    "fears",
    ["afraid", "scared", "terrified", "frightened", "fear"],
    I_AM + ADV + r"\s+(?:afraid|scared|terrified|frightened)\s+of\s+|\bI\s+fear\s+",
)
def _fears(m: re.Match[str], s: Sentence) -> None:
    """ "I am afraid of heights": recorded as a dislike, weakly."""
    _tastes(s, "dislikes", s.after(m), 0.6)


TASTE_RULES: tuple[Rule, ...] = (
    _likes,
    _likes_into,
    _favourite,
    _favourite_reverse,
    _hobbies,
    _dislikes,
    _dislikes_negated_like,
    _likes_no_longer,
    _diet_i_am,
    _diet_verb,
    _diet_negated,
    _diet_avoid,
    _allergic,
    _allergy_have,
    _intolerant,
    _pastime,
    _fears,
)
