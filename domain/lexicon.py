"""Closed English word lists shared by the extractor and the category detector.

They live in the domain because both the rule-based extractor (``uprof.adapters``)
and the memory category detector (``domain.categories``, run by the aggregate and
the projector) read them: one list per concept. All entries are lower-case.
"""

from __future__ import annotations

#: Nationality and belief words that follow "I'm" but are not names ("I'm Dutch").
DEMONYMS: frozenset[str] = frozenset(
    """
    american british english scottish welsh irish canadian australian mexican brazilian
    argentinian chilean colombian peruvian cuban spanish portuguese french german dutch
    belgian swiss austrian italian greek polish czech russian ukrainian swedish norwegian
    danish finnish icelandic turkish egyptian moroccan nigerian kenyan ethiopian
    african european asian indian pakistani chinese japanese korean vietnamese thai
    filipino indonesian malaysian israeli iranian iraqi lebanese syrian saudi latino
    latina hispanic jewish muslim christian catholic protestant hindu buddhist sikh
    mormon atheist agnostic romanian hungarian serbian croatian bulgarian
    """.split()
)


#: Family relations that are informative on their own ("my wife", "my son").
FAMILY_RELATIONS: frozenset[str] = frozenset(
    """
    wife husband partner spouse boyfriend girlfriend fiance fiancee fiancé fiancée son
    daughter kid kids child children baby babies sister brother sibling siblings twin
    stepson stepdaughter grandson granddaughter grandchild grandchildren sons daughters
    sisters brothers twins grandkid grandkids grandsons granddaughters stepsons
    stepdaughters
    """.split()
)


#: Relations everybody has: only worth recording with a name ("my mom Linda").
NAMED_ONLY_RELATIONS: frozenset[str] = frozenset(
    """
    mom mum mother dad father parents grandma grandmother grandpa grandfather aunt uncle
    cousin niece nephew stepmom stepmother stepdad stepfather mother-in-law father-in-law
    sister-in-law brother-in-law
    """.split()
)
