"""Closed English word lists the rule-based extractor checks candidates against.

The lists are deliberately small and conservative: a word that is missing here
costs recall, a word that is wrongly here costs precision, and a profile that
states false facts about a person is worse than one that misses a fact.
All entries are lower-case; look-ups lower-case the candidate first.
"""

from __future__ import annotations

# Shared with the memory category detector: one list per concept (re-exported here).
from domain.lexicon import DEMONYMS as DEMONYMS
from domain.lexicon import FAMILY_RELATIONS as FAMILY_RELATIONS
from domain.lexicon import NAMED_ONLY_RELATIONS as NAMED_ONLY_RELATIONS

#: Head nouns that name an occupation ("I'm a senior software *engineer*").
OCCUPATIONS: frozenset[str] = frozenset(
    """
    accountant actor actress administrator analyst animator apprentice architect artist
    assistant astronaut athlete attorney auditor author baker banker barber barista
    bartender biologist blogger bookkeeper broker builder butcher buyer caregiver carpenter
    cashier ceo cfo chef chemist cleaner clerk coach coder composer consultant contractor
    coo copywriter counselor counsellor courier cto dancer designer detective developer
    dietitian diplomat director doctor drummer economist editor electrician engineer
    entrepreneur executive farmer firefighter fisherman florist founder co-founder
    freelancer gardener geologist guard guitarist hairdresser homemaker housewife
    illustrator influencer instructor intern interpreter investor janitor jeweler jeweller
    journalist judge laborer labourer lawyer lecturer librarian lifeguard machinist manager
    marketer mathematician mechanic midwife miner musician nanny novelist nurse officer
    optician owner painter paralegal paramedic pastor pharmacist photographer physician
    physicist physiotherapist pianist pilot plumber podcaster poet policeman policewoman
    politician postman practitioner president priest principal producer professor
    programmer psychiatrist psychologist rabbi realtor receptionist recruiter reporter
    researcher retiree sailor salesman salesperson saleswoman scientist secretary
    singer soldier solicitor statistician streamer student stylist supervisor surgeon
    surveyor tailor teacher technician therapist trader trainer translator tutor
    veterinarian vet waiter waitress welder writer youtuber
    """.split()
)

#: "-ist" / "-eer" words that look like occupations but describe a disposition or belief.
NOT_OCCUPATIONS: frozenset[str] = frozenset(
    """
    atheist buddhist capitalist career communist extremist feminist fatalist hedonist
    idealist introvert minimalist narcissist optimist perfectionist pessimist pioneer
    purist racist realist sexist socialist specialist tourist volunteer
    """.split()
)

#: Suffixes that almost always end an occupation noun ("electrician", "radiologist").
OCCUPATION_SUFFIXES: tuple[str, ...] = ("ologist", "ician", "ographer", "ist", "eer", "smith")

#: Modifiers that turn "I'm a X" into a judgement rather than a job ("a good cook").
EVALUATIVE: frozenset[str] = frozenset(
    """
    good great bad terrible awful decent amazing awesome excellent huge big total real
    complete horrible lousy poor fine proper natural born wannabe aspiring bit little
    """.split()
)

#: Titles that may follow "the" ("I'm the CTO of Acme").
TITLES: frozenset[str] = frozenset(
    "ceo cto cfo coo founder co-founder owner director manager president head principal".split()
)

LANGUAGES: frozenset[str] = frozenset(
    """
    afrikaans albanian amharic arabic armenian basque bengali bosnian bulgarian burmese
    cantonese catalan croatian czech danish dutch english esperanto estonian farsi
    filipino finnish french galician georgian german greek gujarati hausa hebrew hindi
    hungarian icelandic igbo indonesian irish italian japanese javanese kannada kazakh
    khmer korean kurdish lao latin latvian lithuanian macedonian malay malayalam maltese
    mandarin marathi mongolian nepali norwegian pashto persian polish portuguese punjabi
    romanian russian serbian sinhala slovak slovenian somali spanish swahili swedish
    tagalog tamil telugu thai tibetan turkish ukrainian urdu uzbek vietnamese welsh
    yiddish yoruba zulu asl
    """.split()
)

#: Common words that can follow "I'm" with a capital letter and are never a name.
NOT_NAMES: frozenset[str] = frozenset(
    """
    a an the not no so very really just also still actually currently now here there
    back home fine good great ok okay alright well better worse best sure ready done
    tired sick ill hungry thirsty bored busy happy sad glad sorry scared afraid angry
    upset excited nervous worried stressed anxious exhausted curious interested
    confused lost stuck late early new old young single married divorced engaged
    pregnant retired alone free available away out in on off at from into about over
    going trying looking thinking working feeling getting doing being having using
    learning planning hoping moving leaving staying living coming wondering writing
    always never sometimes often usually honestly literally totally definitely probably
    almost kind sort pretty quite too more less all both only even then because
    bilingual fluent allergic vegan vegetarian pescatarian gluten lactose diabetic
    celiac coeliac unemployed employed self-employed freelance certain convinced
    hi hello hey yes yeah nope lol thanks thank please what who why how where when
    aware able unable right wrong correct serious kidding joking fat thin tall short
    strong weak broke rich poor safe fine overwhelmed ashamed proud grateful thankful
    lucky blessed obsessed addicted passionate crazy into fan big huge
    monday tuesday wednesday thursday friday saturday sunday january february march
    april may june july august september october november december today tomorrow
    human person guy girl man woman boy adult kid child parent mom dad mother father
    god and or but nor yet later soon
    """.split()
)

#: Plural or childish forms mapped to the value stored ("kids" -> "children").
FAMILY_CANONICAL: dict[str, str] = {
    "kid": "child",
    "kids": "children",
    "grandkid": "grandchild",
    "grandkids": "grandchildren",
    "babies": "babies",
    "fiancee": "fiancée",
    "fiance": "fiancé",
    "mum": "mom",
}

PETS: frozenset[str] = frozenset(
    """
    dog dogs puppy puppies cat cats kitten kittens hamster hamsters rabbit rabbits bunny
    parrot parrots bird birds budgie budgies cockatiel goldfish fish turtle turtles
    tortoise snake snakes lizard lizards gecko geckos iguana ferret ferrets chinchilla
    hedgehog rat rats mouse mice horse horses pony ponies chicken chickens duck ducks
    goat goats pig pigs labrador retriever poodle beagle husky terrier bulldog corgi
    dachshund spaniel chihuahua pug collie doodle labradoodle greyhound dalmatian
    rottweiler shepherd pinscher cow cows sheep llama llamas alpaca alpacas raccoon racoon
    dragon tarantula
    """.split()
)

#: Singular forms for pet plurals ("two cats" -> "cat").
PET_SINGULAR: dict[str, str] = {
    "dogs": "dog",
    "puppies": "puppy",
    "cats": "cat",
    "kittens": "kitten",
    "hamsters": "hamster",
    "rabbits": "rabbit",
    "parrots": "parrot",
    "birds": "bird",
    "budgies": "budgie",
    "turtles": "turtle",
    "snakes": "snake",
    "lizards": "lizard",
    "geckos": "gecko",
    "ferrets": "ferret",
    "rats": "rat",
    "mice": "mouse",
    "horses": "horse",
    "ponies": "pony",
    "chickens": "chicken",
    "ducks": "duck",
    "goats": "goat",
    "pigs": "pig",
}

#: Words allowed between "my" and a pet noun ("my little dog").
PET_ADJECTIVES: frozenset[str] = frozenset(
    """
    little old new young black white brown grey gray orange ginger rescue senior baby
    big fat lazy fluffy sweet golden german small tiny miniature bearded pet
    """.split()
)

#: Diets "I'm X" / "I eat X" / "I went X" can name; the value stored is the key.
DIETS: dict[str, str] = {
    "vegan": "vegan",
    "vegetarian": "vegetarian",
    "veggie": "vegetarian",
    "pescatarian": "pescatarian",
    "pescetarian": "pescatarian",
    "keto": "keto",
    "paleo": "paleo",
    "halal": "halal",
    "kosher": "kosher",
    "gluten-free": "gluten-free",
    "dairy-free": "dairy-free",
    "plant-based": "plant-based",
    "flexitarian": "flexitarian",
    "carnivore": "carnivore",
    "meat-eater": "meat-eater",
    "meat eater": "meat-eater",
    "omnivore": "omnivore",
    "raw vegan": "raw vegan",
}

#: "I don't eat X" for these X is a diet; other X are left alone.
AVOIDED_FOODS: dict[str, str] = {
    "meat": "no meat",
    "red meat": "no red meat",
    "pork": "no pork",
    "beef": "no beef",
    "fish": "no fish",
    "dairy": "dairy-free",
    "gluten": "gluten-free",
    "animal products": "vegan",
    "eggs": "no eggs",
    "sugar": "no sugar",
}

#: Numbers spelled out in the range the extractor needs (ages, counts).
NUMBER_WORDS: dict[str, int] = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "thirteen": 13,
    "fourteen": 14,
    "fifteen": 15,
    "sixteen": 16,
    "seventeen": 17,
    "eighteen": 18,
    "nineteen": 19,
    "twenty": 20,
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "eighty": 80,
    "ninety": 90,
}

#: Objects that refer back to something else: "I love it" says nothing durable.
PRONOUN_OBJECTS: frozenset[str] = frozenset(
    """
    it that this you them him her those these what how when where why which who whom me
    myself us your yours his their our some any something anything nothing everything
    everyone anyone someone everybody nobody so not too there here doing being
    """.split()
)

#: Verbs after "I want to" that make a request to the agent, not a life goal.
REQUEST_VERBS: frozenset[str] = frozenset(
    """
    know ask tell say check confirm clarify hear mention point add share explain thank
    apologize apologise vent rant remind figure decide understand recall remember
    """.split()
)

#: Verbs that make a goal only with a real object ("see Japan", not "see if it works").
WEAK_VERBS: frozenset[str] = frozenset(
    "see talk chat go do be have get try make take sleep stop leave start think".split()
)

#: Words after a weak verb that show there is no durable goal ("be honest", "go now").
WEAK_TAILS: frozenset[str] = frozenset(
    """
    if whether honest clear brief quick now back home out away on up sure there here
    again something anything nothing stuff
    """.split()
)

#: Words that make a memory worth more: feelings.
EMOTION_WORDS: frozenset[str] = frozenset(
    """
    love loved hate hated afraid scared anxious anxiety worried worry stressed stress
    excited thrilled happy sad depressed lonely angry upset frustrated nervous proud
    grateful heartbroken overwhelmed exhausted miserable ashamed guilty jealous
    hopeful devastated furious terrified
    """.split()
)

#: Words that mark a life event.
LIFE_EVENT_WORDS: frozenset[str] = frozenset(
    """
    married divorced engaged pregnant born died passed funeral diagnosed surgery hospital
    fired hired promoted promotion graduated graduation retired moved wedding baby
    accident cancer breakup broke
    """.split()
)

#: Tokens of pure small talk; a turn made only of these gets no memory.
FILLER_WORDS: frozenset[str] = frozenset(
    """
    hi hello hey hiya yo howdy greetings ok okay k kk thanks thank thx ty you yes yeah
    yep yup no nope nah sure cool great nice lol haha hahaha bye goodbye good morning
    night evening afternoon please alright fine got it awesome perfect sounds right
    understood welcome cheers hmm hm ah oh wow there much very so that's that is
    i'm im am doing well how are and too again see later np noted agreed true indeed
    gotcha sweet lovely excellent makes sense will do appreciate appreciated
    """.split()
)

#: Common nouns that end a workplace phrase ("a video game company", "the zoo").
WORKPLACES: frozenset[str] = frozenset(
    """
    company store shop firm restaurant hospital school bank daycare factory office zoo mall
    farm bakery cafe café library agency startup supermarket warehouse hotel bar pub gym
    salon clinic church university college airline airport plant mill lab laboratory
    studio newspaper magazine garage dealership casino theater theatre museum nonprofit
    charity station market grocery corporation business diner pharmacy prison
    """.split()
)

#: Lines of work named without a job title ("I work in marketing").
WORK_FIELDS: frozenset[str] = frozenset(
    """
    marketing sales finance retail healthcare construction education it tech hospitality
    insurance accounting advertising banking publishing law medicine nursing engineering
    security logistics hr fashion media film television journalism research government
    politics manufacturing agriculture
    """.split()
)

#: Places someone lives that are not proper names ("I live on a farm").
HOME_PLACES: frozenset[str] = frozenset(
    """
    suburb suburbs farm ranch countryside country city town village island coast mountains
    desert midwest beach boat reservation commune
    """.split()
)
