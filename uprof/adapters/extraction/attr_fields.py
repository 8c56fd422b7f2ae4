"""Facts stated as "field: value": profile forms, records, "Zhang Xiaohong's gender: female".

A field with no owner or with "my" is the subject's own. A field owned by a name is
the subject's when the name is the subject's (the capture's ``subject_actor`` or
actor); a name the turn does not identify as the subject may be anybody, so its
fields are proposed as reported, at reported confidence, never as the subject's word.
"""

from __future__ import annotations

import re

from uprof.adapters.extraction.attr_tastes import list_items, taste_value
from uprof.adapters.extraction.engine import Rule, Sentence, rule
from uprof.adapters.extraction.speaker import same_person
from uprof.adapters.extraction.text import clean, leading_words

#: Field names (lower-case) and the attribute key each fills.
FIELDS: dict[str, str] = {
    "name": "name",
    "full name": "name",
    "first name": "name",
    "age": "age",
    "gender": "gender",
    "sex": "gender",
    "hometown": "origin",
    "home town": "origin",
    "birthplace": "origin",
    "place of birth": "origin",
    "nationality": "origin",
    "origin": "origin",
    "location": "home_location",
    "city": "home_location",
    "residence": "home_location",
    "lives in": "home_location",
    "home": "home_location",
    "occupation": "occupation",
    "job": "occupation",
    "profession": "occupation",
    "job title": "occupation",
    "employer": "employer",
    "company": "employer",
    "workplace": "employer",
    "language": "language",
    "languages": "language",
    "hobby": "likes",
    "hobbies": "likes",
    "interests": "likes",
    "likes": "likes",
    "dislikes": "dislikes",
    "diet": "diet",
    "allergy": "allergy",
    "allergies": "allergy",
    "pet": "pet",
    "pets": "pet",
    "email": "email",
    "phone": "phone",
}
_LIST_KEYS = frozenset({"language", "likes", "dislikes", "allergy", "pet"})
_FIELD = "|".join(sorted((re.escape(f) for f in FIELDS), key=len, reverse=True))
#: An owner: "my", or one to four capitalised words with "'s" ("Zhang Xiaohong's").
_OWNER = r"(?P<owner>my|(?-i:[A-Z][\w-]*)(?:\s+(?-i:[A-Z][\w-]*)){0,3}'s)"
_FIELD_RE = re.compile(
    r"(?:^|(?<=[,;])\s*|\s+)(?:" + _OWNER + r"\s+)?(?P<field>" + _FIELD + r")\s*[:=]\s*",
    re.IGNORECASE,
)
_GENDERS = {
    "female": "female",
    "f": "female",
    "woman": "female",
    "male": "male",
    "m": "male",
    "man": "male",
    "non-binary": "non-binary",
    "nonbinary": "non-binary",
}


def _values(key: str, raw: str) -> list[str]:
    raw = clean(raw)
    if not raw:
        return []
    if key == "gender":
        gender = _GENDERS.get(raw.lower())
        return [gender] if gender else []
    if key == "age":
        m = re.match(r"(\d{1,3})\b", raw)
        return [m.group(1)] if m and 0 < int(m.group(1)) <= 120 else []
    if key in _LIST_KEYS:
        items = (
            (taste_value(i) for i in list_items(raw))
            if key in {"likes", "dislikes"}
            else (clean(i) for i in re.split(r"\s*(?:,|;|\band\b|/)\s*", raw))
        )
        return [i for i in items if i]
    words = leading_words(raw, limit=8)
    if not words or len(raw) > 80:
        return []
    return [raw]


@rule("field_value", [":", "="], _FIELD_RE.pattern, skip_hypothetical=False)
def _field_value(m: re.Match[str], s: Sentence) -> None:
    key = FIELDS[" ".join(m.group("field").lower().split())]
    # The value runs to the next "field:" or the end of the sentence.
    nxt = _FIELD_RE.search(s.text, m.end())
    raw = s.text[m.end() : nxt.start() if nxt else len(s.text)]
    owner = m.group("owner") or ""
    turn = s.turn
    reported = bool(owner) and owner.lower() != "my"
    if reported and turn.subject_name and same_person(owner[:-2], turn.subject_name):
        reported = False  # the subject's own record
    before, turn.reported = turn.reported, turn.reported or reported
    try:
        for value in _values(key, raw):
            turn.attribute(key, value, 0.85)
    finally:
        turn.reported = before


FIELD_RULES: tuple[Rule, ...] = (_field_value,)
