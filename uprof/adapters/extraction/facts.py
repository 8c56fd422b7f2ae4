"""Attribute rules: what a user says about themselves, one key of ATTRIBUTE_KEYS each.

Every trigger is anchored on the user speaking in the first person ("I", "I'm",
"my"), so "my friend is a nurse" or "she lives in Rome" never says anything
about the user. Negated statements either set ``negated=True`` ("I no longer
live in Paris") or become the opposite key ("I don't like olives" -> dislikes).

Confidence tiers: 0.9 for unambiguous forms ("my name is", "I'm allergic to"),
0.8-0.85 for clear ones ("I live in", "I work at"), 0.7-0.75 for forms that
need a lexicon to be read ("I'm a nurse"), 0.6 and below for weak cues.
"""

from __future__ import annotations

from uprof.adapters.extraction.attr_fields import FIELD_RULES
from uprof.adapters.extraction.attr_household import HOUSEHOLD_RULES
from uprof.adapters.extraction.attr_person import PERSON_RULES, languages_in
from uprof.adapters.extraction.attr_tastes import TASTE_RULES, list_items, taste_value
from uprof.adapters.extraction.engine import Rule

#: Every attribute rule, in the order they run on each sentence.
ATTRIBUTE_RULES: tuple[Rule, ...] = PERSON_RULES + TASTE_RULES + HOUSEHOLD_RULES + FIELD_RULES

__all__ = ["ATTRIBUTE_RULES", "languages_in", "list_items", "taste_value"]
