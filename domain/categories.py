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


def _words(raw: str) -> str:
    """An alternation of whole words/phrases (spaces match any whitespace)."""
    items = sorted({w.strip() for w in raw.split(",") if w.strip()}, key=len, reverse=True)
    return "|".join(re.escape(w).replace(r"\ ", r"\s+") for w in items)


def _cue(raw: str) -> str:
    return rf"\b(?:{_words(raw)})\b"


_HEALTH = _cue(
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
_LOCATION = (
    r"\b(?:live|lives|living|lived|reside|resides|residing|resided|settled|raised|born)\s+"
    r"(?:here\s+)?(?:in|at|near|on|outside|around)\b"
    r"|\bbased\s+(?:in|at|near|out\s+of)\b"
    r"|\bgrew\s+up\b"
    r"|\b(?:move|moves|moving|moved|relocate|relocates|relocating|relocated)\s+"
    r"(?:back\s+)?(?:to|from|into|out\s+of|across)\b"
    r"|\b(?:i'm|i\s+am|im|we're|we\s+are)\s+(?:originally\s+)?from\b"
    r"|\b(?:i|we|family)\s+(?:come|comes|came)\s+from\b"
    r"|\b(?:fly|flying|flew|travel|travelling|traveling|travelled|traveled|trip|"
    r"vacation|holiday|holidays|visit)\s+(?:to|in|from)\b"
    r"|\b(?:my|our)\s+(?:home\s*town|city|town|village|neighbou?rhood|country|street|"
    r"apartment|flat|house|place|home|address|location)\b"
    r"|"
    + _cue(
        """
        home address, hometown, home town, zip code, zipcode, postcode, post code,
        postal code, where i live, where we live, current location
        """
    )
    + r"|\b\d{1,5}\s+(?:[A-Za-z]+\s+){1,3}(?:street|st|road|rd|avenue|ave|lane|ln|"
    r"boulevard|blvd|drive|dr|way|court|ct|place|pl|square|sq)\b"
)
_FAMILY_WORDS = sorted(FAMILY_RELATIONS | NAMED_ONLY_RELATIONS, key=len, reverse=True)
_FAMILY = (
    r"\b(?:my|our|mine|his|her|their)\s+(?:[\w'-]+\s+){0,2}(?:"
    + "|".join(re.escape(w) for w in _FAMILY_WORDS)
    + r")\b|"
    + _cue(
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
)
_FINANCE = (
    _cue(
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
    + r"|[$€£¥₹]\s?\d|\b\d[\d,.]*\s?(?:k|usd|eur|gbp|dollars|euros|pounds)\b"
)
_DEMONYM_WORDS = "|".join(re.escape(w) for w in sorted(DEMONYMS, key=len, reverse=True))
_IDENTITY = (
    r"\b(?:my\s+name\s+is|my\s+name's|call\s+me\s+(?-i:[A-Z])|i'm\s+called|i\s+am\s+called|"
    r"my\s+(?:full|first|last|middle|maiden|real)\s+name|years?\s+old|"
    r"my\s+birthday|my\s+birth\s*date|date\s+of\s+birth|born\s+(?:in|on))\b"
    r"|\b(?:i'm|i\s+am|im|as\s+an?|being|we're|we\s+are)\s+(?:a\s+|an\s+)?(?:[\w-]+\s+)?(?:"
    + _DEMONYM_WORDS
    + r")\b|"
    + _cue(
        """
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
)
_CONTACT = (
    r"[\w.+-]+@[\w-]+\.[\w.-]+"
    r"|\b(?:my|our)\s+(?:phone|cell|mobile|number|email|e-mail|address|handle|instagram|"
    r"twitter|whatsapp|telegram|signal|snapchat|tiktok|linkedin|skype|discord)\b"
    r"|\b(?:reach|text|call|email|contact|dm|message)\s+me\s+(?:at|on)\b"
    r"|(?<![\w@])@[A-Za-z_][\w.]{2,}"
)

_PATTERNS: dict[str, re.Pattern[str]] = {
    "health": re.compile(_HEALTH, re.IGNORECASE),
    "location": re.compile(_LOCATION, re.IGNORECASE),
    "family": re.compile(_FAMILY, re.IGNORECASE),
    "finance": re.compile(_FINANCE, re.IGNORECASE),
    "identity": re.compile(_IDENTITY, re.IGNORECASE),
    "contact": re.compile(_CONTACT, re.IGNORECASE),
}

#: A run of digits and phone punctuation; a phone number has 9 to 15 digits (E.164).
_PHONE_RUN = re.compile(r"(?<![\w.])\+?\(?\d[\d\s().-]{6,}\d(?![\w])")
#: Dates and ranges of years look like digit runs but are not numbers to call.
_NOT_PHONE = re.compile(
    r"^\d{4}[-./]\d{1,2}[-./]\d{1,2}$|^\d{1,2}[-./]\d{1,2}[-./]\d{2,4}$|^\d{4}\s*-\s*\d{4}$"
)


def _has_phone_number(text: str) -> bool:
    for m in _PHONE_RUN.finditer(text):
        run = m.group(0).strip()
        digits = sum(c.isdigit() for c in run)
        if 9 <= digits <= 15 and not _NOT_PHONE.match(run):
            return True
    return False


#: Longest text the detector reads; memories are short, a pasted document is cut here.
MAX_DETECTED_CHARS = 20_000


def detect_categories(text: str) -> frozenset[str]:
    """Return the sensitive categories the text reveals (possibly none)."""
    if not text:
        return frozenset()
    window = text[:MAX_DETECTED_CHARS].replace("\u2019", "'")
    found = {c for c, pattern in _PATTERNS.items() if pattern.search(window)}
    if "contact" not in found and _has_phone_number(window):
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
