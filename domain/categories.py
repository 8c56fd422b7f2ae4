"""Which catalogue categories a memory's text reveals: the sensitive-category detector.

A memory is what a person said, kept in their words, so it can reveal anything an
attribute could: "I live in Lisbon" is a ``location`` whatever its proposer called it.
Policy and consent withhold categories, so a memory must carry every category it
reveals (decision 0016). Three sources feed a memory's categories:

1. the category its proposer gave it (``conversation`` for the extractor);
2. the categories of every attribute and intent proposed from the same capture;
3. this detector, over the memory's own text.

The detector is cue lists and patterns per sensitive category. It errs towards
tagging: a memory wrongly tagged ``health`` is withheld from an app that may not
read health (the safe side); a health memory tagged only ``conversation`` is served to
it. It does not tag every sentence: each cue is a word or phrase that names the
category's subject matter, never a common function word. It is pure and
deterministic, so the aggregate (when a memory is recorded) and the projector (when
an old event is replayed) reach the same answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from domain.lexicon import DEMONYMS, FAMILY_RELATIONS, NAMED_ONLY_RELATIONS

#: The categories this detector looks for (all in ``domain.values.CATEGORIES``).
DETECTED_CATEGORIES: tuple[str, ...] = (
    "health",
    "location",
    "family",
    "finance",
    "identity",
    "contact",
)


def _cues(raw: str) -> tuple[frozenset[str], tuple[str, ...]]:
    """Split a comma-separated cue list into single words and padded phrases."""
    items = {" ".join(_tokens(w)) for w in raw.split(",") if w.strip()}
    words = frozenset(w for w in items if " " not in w)
    phrases = tuple(sorted(f" {w} " for w in items if " " in w))
    return words, phrases


_TOKEN_RE = re.compile(r"[a-z0-9]+(?:['-][a-z0-9]+)*")


def _tokens(text: str) -> list[str]:
    return _TOKEN_RE.findall(text.lower().replace("\u2019", "'"))


_HEALTH = _cues(
    """
    health, healthy, ill, illness, sick, sickness, disease, disorder, syndrome,
    diagnosed, diagnosis, diagnoses, symptom, symptoms, doctor, doctors, gp, physician,
    nurse, hospital, hospitalised, hospitalized, clinic, emergency room, surgery,
    surgeon, therapist, therapy, physio, physiotherapy, psychiatrist,
    psychologist, counsellor, counselor, medication, medications, medicine, meds, pill,
    pills, prescription, prescribed, antibiotics, antidepressant, antidepressants,
    insulin, inhaler, chemo, chemotherapy, radiation, cancer, tumor, tumour, diabetes,
    diabetic, asthma, asthmatic, allergy, allergies, allergic, intolerant, intolerance,
    celiac, coeliac, epilepsy, epileptic, seizure, seizures, migraine, migraines,
    depression, depressed, anxiety disorder, panic attack, panic attacks, bipolar, adhd,
    autism, autistic, ocd, ptsd, eating disorder, anorexia, bulimia, insomnia, dementia,
    alzheimer, alzheimer's, parkinson, parkinson's, arthritis, hiv, aids, std, sti,
    pregnant, pregnancy, miscarriage, ivf, fertility, infertile, period cramps, menopause,
    injury, injured, injuries, fracture, fractured, broke my arm, broke my leg, sprained,
    concussion, pain, chronic, blood pressure, cholesterol, heart attack, heart condition,
    stroke, covid, flu, fever, infection, virus, vaccine, vaccinated, disabled,
    disability, wheelchair, rehab, sober, sobriety, alcoholic, addiction, addicted,
    overdose, dentist, dental, mental health, suicidal, self-harm, blind, deaf, hearing aid
    """
)
_LOCATION = _cues(
    """
    home address, hometown, home town, zip code, zipcode, postcode, post code,
    postal code, where i live, where we live, current location, grew up
    """
)
#: (verbs, what must follow one of them) that state where someone is, was or goes.
_LOCATION_PAIRS: tuple[tuple[frozenset[str], frozenset[str]], ...] = (
    (
        frozenset(
            "live lives living lived reside resides residing resided settled raised born".split()
        ),
        frozenset("in at near on outside around".split()),
    ),
    (frozenset(["based"]), frozenset("in at near out".split())),
    (
        frozenset("move moves moving moved relocate relocates relocating relocated".split()),
        frozenset("to from into out across back".split()),
    ),
    (
        frozenset(
            "fly flying flew travel travelling traveling travelled traveled trip vacation "
            "holiday holidays visit".split()
        ),
        frozenset("to in from".split()),
    ),
)
_LOCATION_NOUNS = frozenset(
    "hometown city town village neighbourhood neighborhood country street apartment flat "
    "house place home address location".split()
)
_FROM_SUBJECTS = frozenset("i'm im we're".split())
_ADDRESS = re.compile(
    r"\b\d{1,5}\s+(?:[A-Za-z]+\s+){1,3}(?:street|st|road|rd|avenue|ave|lane|ln|"
    r"boulevard|blvd|drive|dr|way|court|ct|place|pl|square|sq)\b",
    re.IGNORECASE,
)
_FAMILY = _cues(
    """
    wife, husband, spouse, fiance, fiancee, fiancé, fiancée, boyfriend, girlfriend,
    son, daughter, kids, children, grandchildren, grandkids, stepson, stepdaughter,
    married, marriage, divorce, divorced, divorcing, separated, widow, widowed, widower,
    engaged, engagement, wedding, newborn, family, families, relatives, in-laws,
    custody, adopted, adoption, sibling, siblings, parenting, parenthood, mom, dad,
    mum, mother, father, parents, brother, sister, grandma, grandpa, grandmother,
    grandfather
    """
)
_RELATIONS = FAMILY_RELATIONS | NAMED_ONLY_RELATIONS
_POSSESSIVES = frozenset("my our mine his her their".split())
_FINANCE = _cues(
    """
    money, salary, salaries, wage, wages, paycheck, pay check, payslip, income, earn,
    earning, earnings, pay raise, bonus, debt, debts, loan, loans, mortgage, rent, landlord,
    bank, banking, bank account, account number, iban, routing number,
    credit card, debit card, credit score, overdraft, savings, saving up, pension,
    retirement fund, 401k, ira, invest, investing, investment, investments,
    stocks, portfolio, crypto, bitcoin, ethereum, bankrupt, bankruptcy, tax,
    taxes, irs, hmrc, budget, budgeting, afford, i'm broke, i am broke, owe, owed,
    owes, bills, invoice, insurance, net worth, inheritance, inherited, financial,
    finances, cash, payment, payments, paypal, venmo, wire transfer, dollars, euros,
    pounds, bucks
    """
)
_MONEY = re.compile(
    r"[$€£¥₹]\s?\d|\b\d[\d,.]*\s?(?:k|usd|eur|gbp|dollars|euros|pounds)\b", re.IGNORECASE
)
_IDENTITY = _cues(
    """
    my name is, my name's, i'm called, i am called, my full name, my first name,
    my last name, my middle name, my maiden name, my real name, years old, year old,
    my birthday, my birth date, my birthdate, date of birth, born in, born on,
    passport, social security, ssn, national insurance, national id, id card, id number,
    driver's license, drivers license, driver's licence, driving licence, license number,
    birth certificate, citizenship, citizen, immigrant, immigration, visa, green card,
    refugee, asylum, ethnicity, ethnic, racial, religion, religious, faith, church, mosque,
    synagogue, temple, pray, praying, prayer, prayers, ramadan, bible, quran, koran,
    torah, gay, lesbian, bisexual, queer, transgender, trans, nonbinary, non-binary,
    lgbt, lgbtq, coming out, came out, sexuality, sexual orientation, pronouns,
    gender identity, political, politics, vote, voted, voting, democrat, republican,
    conservative, liberal, labour party, tory, union member, trade union
    """
)
#: Words after which a demonym or belief describes the speaker ("I'm Dutch", "as a Catholic").
_SELF_MARKERS = frozenset("i'm im am being we're".split())
_CALL_ME_NAME = re.compile(r"\b[Cc]all\s+me\s+[A-Z]")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+")
_HANDLE = re.compile(r"(?<![\w@])@[A-Za-z_][\w.]{2,}")
_CONTACT_NOUNS = frozenset(
    "phone cell mobile number email e-mail address handle instagram twitter whatsapp "
    "telegram signal snapchat tiktok linkedin skype discord".split()
)
_CONTACT = _cues(
    """
    reach me at, reach me on, text me at, text me on, call me at, call me on, email me at,
    contact me at, contact me on, dm me on, message me on, message me at
    """
)
#: A run of digits and phone punctuation; a phone number has 9 to 15 digits (E.164).
_PHONE_RUN = re.compile(r"(?<![\w.])\+?\(?\d[\d\s().-]{6,}\d(?!\w)")
#: Dates and ranges of years look like digit runs but are not numbers to call.
_NOT_PHONE = re.compile(
    r"^\d{4}[-./]\d{1,2}[-./]\d{1,2}$|^\d{1,2}[-./]\d{1,2}[-./]\d{2,4}$|^\d{4}\s*-\s*\d{4}$"
)


def _has_phone_number(text: str) -> bool:
    if sum(c.isdigit() for c in text) < 9:
        return False
    for m in _PHONE_RUN.finditer(text):
        run = m.group(0).strip()
        digits = sum(c.isdigit() for c in run)
        if 9 <= digits <= 15 and not _NOT_PHONE.match(run):
            return True
    return False


def _has(cues: tuple[frozenset[str], tuple[str, ...]], words: set[str], joined: str) -> bool:
    single, phrases = cues
    return not single.isdisjoint(words) or any(p in joined for p in phrases)


def _followed(tokens: list[str], first: frozenset[str], then: frozenset[str], gap: int) -> bool:
    """Whether a token of ``first`` is followed within ``gap`` tokens by one of ``then``."""
    for i, token in enumerate(tokens):
        if token in first and not then.isdisjoint(tokens[i + 1 : i + 1 + gap]):
            return True
    return False


def _location(tokens: list[str], words: set[str], joined: str, text: str) -> bool:
    if _has(_LOCATION, words, joined):
        return True
    for verbs, after in _LOCATION_PAIRS:
        if not verbs.isdisjoint(words) and _followed(tokens, verbs, after, 2):
            return True
    if _followed(tokens, _POSSESSIVES, _LOCATION_NOUNS, 2):
        return True
    if "from" in words and (
        _followed(tokens, _FROM_SUBJECTS, frozenset(["from"]), 2)
        or " i am from " in joined
        or " i am originally from " in joined
        or any(
            f" {s} {v} from " in joined
            for s in ("i", "we", "family")
            for v in ("come", "came", "comes")
        )
    ):
        return True
    return any(c.isdigit() for c in text) and _ADDRESS.search(text) is not None


def _family(tokens: list[str], words: set[str], joined: str) -> bool:
    if _has(_FAMILY, words, joined):
        return True
    return not _RELATIONS.isdisjoint(words) and _followed(tokens, _POSSESSIVES, _RELATIONS, 3)


def _finance(words: set[str], joined: str, text: str) -> bool:
    if _has(_FINANCE, words, joined):
        return True
    return any(c.isdigit() for c in text) and _MONEY.search(text) is not None


def _identity(tokens: list[str], words: set[str], joined: str, text: str) -> bool:
    if _has(_IDENTITY, words, joined) or _CALL_ME_NAME.search(text):
        return True
    if DEMONYMS.isdisjoint(words):
        return False
    if _followed(tokens, _SELF_MARKERS, DEMONYMS, 3):
        return True
    return any(f" as {a} {d} " in joined for a in ("a", "an") for d in DEMONYMS & words)


def _contact(tokens: list[str], words: set[str], joined: str, text: str) -> bool:
    if "@" in text and (_EMAIL.search(text) or _HANDLE.search(text)):
        return True
    if _has(_CONTACT, words, joined):
        return True
    if not _CONTACT_NOUNS.isdisjoint(words) and _followed(
        tokens, frozenset(["my", "our"]), _CONTACT_NOUNS, 1
    ):
        return True
    return _has_phone_number(text)


#: Longest text the detector reads; memories are short, a pasted document is cut here.
MAX_DETECTED_CHARS = 20_000


def detect_categories(text: str) -> frozenset[str]:
    """Return the sensitive categories the text reveals (possibly none)."""
    if not text:
        return frozenset()
    window = text[:MAX_DETECTED_CHARS].replace("\u2019", "'")
    tokens = _tokens(window)
    words = set(tokens)
    joined = f" {' '.join(tokens)} "
    found = set()
    if _has(_HEALTH, words, joined):
        found.add("health")
    if _location(tokens, words, joined, window):
        found.add("location")
    if _family(tokens, words, joined):
        found.add("family")
    if _finance(words, joined, window):
        found.add("finance")
    if _identity(tokens, words, joined, window):
        found.add("identity")
    if _contact(tokens, words, joined, window):
        found.add("contact")
    return frozenset(found)


def memory_categories(
    primary: str, *, revealed: Iterable[str] = (), texts: Iterable[str] = ()
) -> list[str]:
    """Return a memory's categories: its primary one first, then the rest sorted.

    ``revealed`` are the categories known from elsewhere (the proposer's extra
    labels, the attributes and intents of the same capture); ``texts`` are what the
    memory shows (its text, or an experience's fields), run through the detector.
    """
    found = set(revealed)
    for text in texts:
        found |= detect_categories(text)
    found.discard(primary)
    return [primary, *sorted(found)]
