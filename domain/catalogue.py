"""The category catalogue: every category of the profile, in one entry each.

A category is what consent, policy and items share: an app is granted ``diet``, a policy
row lets a role read ``health``, an attribute ``allergy`` is a ``health`` item. Each
entry (``CategorySpec``) says everything the rest of the service needs to know about
its category, and the rest is derived from the entries:

* ``CATEGORIES`` and ``ATTRIBUTE_KEYS`` (``domain.values``), so the REST and MCP schemas,
  consent's ``*``, the policy's category hierarchy and the console's forms;
* the attribute lines of the LLM extractor's prompt (``uprof.adapters.extraction.llm``),
  from each key's ``description``;
* the retrieval cue words (``uprof.retrieval.ranker``), from ``retrieval_cues``;
* the sensitive-category detector's cues (``domain.categories``), from ``detector_cues``.

Each attribute key carries one sentence the rule-based extractor reads it from
(``example``), which the extraction tests run, so a key added here without rule patterns
fails them. Adding a category is this entry, the rule patterns for its keys
(``uprof/adapters/extraction/attr_*.py``) and the seed policy rows
(``policies/seed_policy.csv``): docs/architecture.md, "How to add an attribute category".

The module is plain data and checks; it imports nothing of the service (the domain
layer), and a ``Catalogue`` can be extended (``Catalogue.extended``) to try a category
out without touching the default one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class AttributeKeySpec:
    """What the kernel needs of an attribute key: its category, and whether a key holds
    one value (a different value supersedes it or conflicts with it) or many (values
    accumulate)."""

    category: str
    single_valued: bool


@dataclass(frozen=True)
class Example:
    """A sentence the rule-based extractor reads a key from, and the value it reads."""

    sentence: str
    value: str


@dataclass(frozen=True)
class AttributeKey:
    """One attribute key of a category.

    ``description`` is the key's line in the LLM extractor's prompt. ``example`` is a
    sentence the rule-based extractor must read this key from; None for a key only the
    LLM extractor proposes (no rule pattern reads it).
    """

    name: str
    single_valued: bool
    description: str
    example: Example | None = None


@dataclass(frozen=True)
class CategorySpec:
    """One category of the catalogue.

    ``retrieval_cues``: space-separated words that, in a question, point at the category
    ("what pets ..."), stemmed by the ranker; empty for a category no question names.
    ``detector_cues``: comma-separated words and phrases whose presence in a memory's text
    reveals the category; non-empty makes the category sensitive, so the detector tags
    memories with it (decision 0016). Cues name the category's subject matter, never a
    common function word.
    """

    name: str
    keys: tuple[AttributeKey, ...] = ()
    retrieval_cues: str = ""
    detector_cues: str = ""

    @property
    def sensitive(self) -> bool:
        """Whether the detector looks for this category in memories' text."""
        return bool(self.detector_cues.strip())


_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


@dataclass(frozen=True)
class Catalogue:
    """The categories in their order, each with its keys and cues.

    ``key_order``: keys listed first, in this order, in ``attribute_keys()`` (and so in the
    LLM prompt); every other key follows in catalogue order. It holds the order the keys
    had before the catalogue existed, which is not grouped by category (``allergy``, a
    ``health`` key, comes after ``diet``), so that the prompt stays byte-identical. A new
    key needs no entry here.
    """

    specs: tuple[CategorySpec, ...]
    key_order: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        categories: set[str] = set()
        owner: dict[str, str] = {}
        for spec in self.specs:
            where = f"category {spec.name!r}"
            if not _NAME_RE.match(spec.name):
                raise ValueError(
                    f"{where}: name must be 1-40 lowercase letters, digits or _, "
                    "starting with a letter"
                )
            if spec.name in categories:
                raise ValueError(f"{where}: name is already in the catalogue")
            categories.add(spec.name)
            if spec.name == "any":
                raise ValueError(f"{where}: name 'any' is the policy's root category")
            for key in spec.keys:
                if not _NAME_RE.match(key.name):
                    raise ValueError(
                        f"{where}: key name {key.name!r} must be 1-40 lowercase letters, "
                        "digits or _, starting with a letter"
                    )
                if key.name in owner:
                    raise ValueError(
                        f"{where}: key {key.name!r} already belongs to {owner[key.name]!r}"
                    )
                owner[key.name] = spec.name
                if not key.description.strip() or "\n" in key.description:
                    raise ValueError(
                        f"{where}: key {key.name!r}: description must be one non-empty line"
                    )
                if key.example is not None and not (
                    key.example.sentence.strip() and key.example.value.strip()
                ):
                    raise ValueError(
                        f"{where}: key {key.name!r}: example needs a sentence and a value"
                    )
        unknown = [k for k in self.key_order if k not in owner]
        if unknown:
            raise ValueError(f"key_order: {', '.join(unknown)} not a key of any category")
        if len(set(self.key_order)) != len(self.key_order):
            raise ValueError("key_order: a key is listed twice")

    @property
    def categories(self) -> tuple[str, ...]:
        """The category names, in catalogue order."""
        return tuple(spec.name for spec in self.specs)

    def spec(self, name: str) -> CategorySpec:
        """The entry of one category (KeyError for an unknown one)."""
        for spec in self.specs:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def keys(self) -> tuple[tuple[AttributeKey, str], ...]:
        """Every attribute key with its category: ``key_order`` first, then the rest."""
        pairs = {key.name: (key, spec.name) for spec in self.specs for key in spec.keys}
        first = [pairs[name] for name in self.key_order]
        rest = [pair for name, pair in pairs.items() if name not in self.key_order]
        return tuple(first + rest)

    def attribute_keys(self) -> dict[str, AttributeKeySpec]:
        """``ATTRIBUTE_KEYS``: each key's category and whether it is single-valued."""
        return {
            key.name: AttributeKeySpec(category, key.single_valued) for key, category in self.keys()
        }

    def extended(self, *specs: CategorySpec) -> Catalogue:
        """This catalogue with more categories after its own (a new catalogue)."""
        return Catalogue(self.specs + specs, self.key_order)


#: The catalogue. Its order is the order of ``CATEGORIES``.
CATALOGUE = Catalogue(
    specs=(
        CategorySpec(
            "identity",
            keys=(
                AttributeKey(
                    "name",
                    single_valued=True,
                    description="the user's own name",
                    example=Example("My name is Sam Lee", "Sam Lee"),
                ),
                AttributeKey(
                    "age",
                    single_valued=True,
                    description="age in years, digits only",
                    example=Example("I'm 34 years old.", "34"),
                ),
                AttributeKey(
                    "gender",
                    single_valued=True,
                    description=(
                        "the user's gender as they state it ('female', 'male', 'non-binary')"
                    ),
                ),
            ),
            retrieval_cues=(
                "name names age old birthday born gender identity pronoun pronouns nationality"
            ),
            detector_cues="""
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
            """,
        ),
        CategorySpec(
            "location",
            keys=(
                AttributeKey(
                    "home_location",
                    single_valued=True,
                    description="where the user lives now (city, region or country)",
                    example=Example("I live in St. Louis", "St. Louis"),
                ),
                AttributeKey(
                    "origin",
                    single_valued=True,
                    description="where the user is from or grew up",
                    example=Example("I grew up in Manchester", "Manchester"),
                ),
            ),
            retrieval_cues=(
                "live lives living city country home move moved town address neighborhood "
                "located location hometown"
            ),
            detector_cues="""
            home address, hometown, home town, zip code, zipcode, postcode, post code,
            postal code, where i live, where we live, current location, grew up
            """,
        ),
        CategorySpec(
            "occupation",
            keys=(
                AttributeKey(
                    "occupation",
                    single_valued=True,
                    description="job or role (e.g. 'nurse', 'software engineer', 'student')",
                    example=Example("I work as a barista at Blue Bottle", "barista"),
                ),
                AttributeKey(
                    "employer",
                    single_valued=True,
                    description="organisation the user works for",
                    example=Example("I work as a barista at Blue Bottle", "Blue Bottle"),
                ),
            ),
            retrieval_cues=(
                "job jobs work works working career occupation employer company profession "
                "office colleague boss business employed"
            ),
        ),
        CategorySpec(
            "language",
            keys=(
                AttributeKey(
                    "language",
                    single_valued=False,
                    description="a language the user speaks, e.g. 'Spanish'",
                    example=Example("My native language is Portuguese", "Portuguese"),
                ),
            ),
            retrieval_cues=(
                "language languages speak speaks english spanish french german chinese "
                "translate fluent"
            ),
        ),
        CategorySpec(
            "preference",
            keys=(
                AttributeKey(
                    "likes",
                    single_valued=False,
                    description="something the user likes or enjoys",
                    example=Example("I like rock and roll", "rock and roll"),
                ),
                AttributeKey(
                    "dislikes",
                    single_valued=False,
                    description="something the user dislikes",
                    example=Example("I don't like olives", "olives"),
                ),
            ),
            retrieval_cues=(
                "like likes favorite favourite prefer prefers preference enjoy enjoys love hate "
                "dislike recommend recommendation suggest suggestion hobby hobbies taste style"
            ),
        ),
        CategorySpec(
            "diet",
            keys=(
                AttributeKey(
                    "diet",
                    single_valued=True,
                    description="diet such as 'vegan', 'vegetarian', 'no meat'",
                    example=Example("I'm vegan", "vegan"),
                ),
            ),
            retrieval_cues=(
                "eat eats eating food foods meal meals diet vegetarian vegan cook cooking "
                "recipe restaurant dinner lunch breakfast snack drink drinks allergy allergic "
                "gluten"
            ),
        ),
        CategorySpec(
            "pet",
            keys=(
                AttributeKey(
                    "pet",
                    single_valued=False,
                    description="a pet, e.g. 'dog named Rex'",
                    example=Example("I have a dog named Rex", "dog named Rex"),
                ),
            ),
            retrieval_cues="pet pets dog dogs cat cats puppy kitten animal animals vet",
        ),
        CategorySpec(
            "family",
            keys=(
                AttributeKey(
                    "family",
                    single_valued=False,
                    description="a family member, e.g. 'wife named Anna', '2 children'",
                    example=Example("I have two kids", "2 children"),
                ),
            ),
            retrieval_cues=(
                "family kid kids child children son daughter wife husband partner mother father "
                "mom dad sister brother parent parents grandma grandpa married"
            ),
            detector_cues="""
            wife, husband, spouse, fiance, fiancee, fiancé, fiancée, boyfriend, girlfriend,
            son, daughter, kids, children, grandchildren, grandkids, stepson, stepdaughter,
            married, marriage, divorce, divorced, divorcing, separated, widow, widowed, widower,
            engaged, engagement, wedding, newborn, family, families, relatives, in-laws,
            custody, adopted, adoption, sibling, siblings, parenting, parenthood, mom, dad,
            mum, mother, father, parents, brother, sister, grandma, grandpa, grandmother,
            grandfather
            """,
        ),
        CategorySpec(
            "schedule",
            keys=(
                AttributeKey(
                    "routine",
                    single_valued=False,
                    description="a recurring habit, e.g. 'go for a run every morning'",
                    example=Example("I usually wake up at 6am", "wake up at 6am"),
                ),
            ),
            retrieval_cues=(
                "schedule routine morning evening weekend weekends calendar appointment meeting "
                "daily weekly"
            ),
        ),
        # Intents' default category; it owns no attribute key.
        CategorySpec(
            "goal",
            retrieval_cues="goal goals plan plans planning want wants aim hope dream aspire intend",
        ),
        CategorySpec(
            "health",
            keys=(
                AttributeKey(
                    "allergy",
                    single_valued=False,
                    description="something the user is allergic or intolerant to",
                    example=Example("I'm lactose intolerant", "lactose"),
                ),
            ),
            retrieval_cues=(
                "health healthy doctor allergy allergies medication medicine sick ill pain "
                "exercise sleep injury"
            ),
            detector_cues="""
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
            """,
        ),
        CategorySpec(
            "contact",
            keys=(
                AttributeKey(
                    "email",
                    single_valued=True,
                    description="the user's own email address",
                    example=Example("My email is Sam.Lee@Example.com", "sam.lee@example.com"),
                ),
                AttributeKey(
                    "phone",
                    single_valued=True,
                    description="the user's own phone number",
                    example=Example("You can reach me at 415-555-0123", "4155550123"),
                ),
            ),
            retrieval_cues="email phone contact call number reach",
            detector_cues="""
            reach me at, reach me on, text me at, text me on, call me at, call me on, email me at,
            contact me at, contact me on, dm me on, message me on, message me at
            """,
        ),
        # Memories' primary category as the extractor proposes them.
        CategorySpec(
            "conversation",
        ),
        # Experience memories (situation, action, outcome, insight) shared between agents.
        CategorySpec(
            "experience",
        ),
        # Sensitive, with no key: memories that mention money carry it (decision 0016).
        CategorySpec(
            "finance",
            detector_cues="""
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
            """,
        ),
    ),
    # The order ATTRIBUTE_KEYS and the LLM prompt had before the catalogue (Catalogue.key_order).
    key_order=(
        "name",
        "age",
        "gender",
        "home_location",
        "origin",
        "occupation",
        "employer",
        "language",
        "likes",
        "dislikes",
        "diet",
        "allergy",
        "pet",
        "family",
        "routine",
        "email",
        "phone",
    ),
)
