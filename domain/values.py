"""Value objects shared by the aggregates, the extractors and the read side.

Everything here is frozen and made of plain values, so it can travel inside
event payloads unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from domain.catalogue import CATALOGUE
from domain.catalogue import AttributeKeySpec as AttributeKeySpec
from domain.errors import InvalidInputError

#: An item with no evidence is inferred, and its confidence never exceeds this cap (I1).
INFERRED_CONFIDENCE_CAP = 0.5
#: Confidence a bare extraction gets when the extractor does not say.
DEFAULT_CONFIDENCE = 0.6
#: Most evidence pointers kept per item on the write side; the read side keeps all.
MAX_EVIDENCE_IN_AGGREGATE = 32


class Layer(StrEnum):
    ATTRIBUTE = "attribute"
    MEMORY = "memory"
    INTENT = "intent"


class Provenance(StrEnum):
    """Whether the user said it (explicit), someone else said it about the user
    (reported), or it was concluded (inferred)."""

    EXPLICIT = "explicit"
    REPORTED = "reported"
    INFERRED = "inferred"


class AttributeStatus(StrEnum):
    CURRENT = "current"
    CONFLICTING = "conflicting"
    SUPERSEDED = "superseded"


class IntentStatus(StrEnum):
    ACTIVE = "active"
    FULFILLED = "fulfilled"
    ABANDONED = "abandoned"
    EXPIRED = "expired"


#: The closed category catalogue that consent, policy and items share, in catalogue order
#: (one entry per category in ``domain.catalogue``).
CATEGORIES: tuple[str, ...] = CATALOGUE.categories

#: Attribute keys the kernel knows. single-valued keys produce conflicts or
#: supersessions when a different value arrives; multi-valued keys accumulate.
ATTRIBUTE_KEYS: dict[str, AttributeKeySpec] = CATALOGUE.attribute_keys()


def attribute_spec(key: str) -> AttributeKeySpec:
    """Look up a known attribute key, or refuse it with a clear error."""
    try:
        return ATTRIBUTE_KEYS[key]
    except KeyError:
        known = ", ".join(sorted(ATTRIBUTE_KEYS))
        raise InvalidInputError(f"unknown attribute key {key!r}; known keys: {known}") from None


#: App, agent and purpose ids: short tokens, so they can travel into the audit log,
#: which refuses anything that could be a name, a sentence or an address.
_TOKEN_RE = re.compile(r"^[A-Za-z0-9_.:/*#=\-]{1,128}$")


def check_token(field_name: str, value: str) -> str:
    """Refuse an id that is not a short token (letters, digits, ``_.:/*#=-``)."""
    # fullmatch: ``$`` also matches before a final line end, and ``x\n`` passed here while
    # the audit entry refused it, stopping the read recorder (round 7, bug HL).
    if not _TOKEN_RE.fullmatch(value or ""):
        raise InvalidInputError(
            f"{field_name} must be 1-128 letters, digits or _.:/*#=- "
            f"(got {len(value or '')} chars)",
            field=field_name,
        )
    return value


def text_problem(value: str) -> str:
    """Why no store keeps ``value`` as text, or '': a NUL character (PostgreSQL text holds
    none) or a lone surrogate (UTF-8 has none; what Python makes of a byte that is not
    UTF-8 in a command line or a file). The one rule of the REST edge's text fields and
    of the door's own inputs (the residue scan's terms, settle-host's host)."""
    if "\x00" in value:
        return "must not contain NUL characters"
    if not value.isascii():  # a flag of the string: ASCII text is never encoded here
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "must be valid Unicode (no lone surrogates)"
    return ""


def check_text(field_name: str, value: str) -> str:
    """Refuse text no store keeps faithfully (``text_problem``: a NUL character, a lone
    surrogate), naming ``field_name``. It refused NUL only: a lone surrogate handed to the
    kernel's ``capture_many`` (embedded code, an import) went on to the event's encoding
    and raised ``UnicodeEncodeError`` (bug ON)."""
    problem = text_problem(value)
    if problem:
        raise InvalidInputError(f"{field_name} {problem}", field=field_name)
    return value


def check_category(category: str) -> str:
    if category not in CATEGORIES:
        raise InvalidInputError(
            f"unknown category {category!r}; known categories: {', '.join(CATEGORIES)}"
        )
    return category


# --- Sharing between agents (kernel-managed shared memory) -------------------------

_SHARING_RE = re.compile(r"^(private|shared|shared:[a-z0-9_.-]+(,[a-z0-9_.-]+)*)$")


def check_sharing(raw: str) -> str:
    """The sharing value as a request states it, or ValueError saying what is accepted.

    Surfaces refuse a malformed value (a typo such as ``sharde`` must not be stored
    silently as private); ``SharingPolicy.parse`` still reads anything stored as private.
    """
    if not _SHARING_RE.match(raw):
        raise ValueError(
            f"must be 'private', 'shared' or 'shared:<agent type>[,<agent type>...]' "
            f"with lowercase agent types, for example 'shared:planner,coach' (got {raw!r})"
        )
    return raw


@dataclass(frozen=True)
class SharingPolicy:
    """Who besides the owner agent may see an item.

    ``private``: the owner agent only. ``shared``: every agent the policy allows.
    ``shared:typeA,typeB``: agents of those types only. Anything missing or
    malformed parses as private (I4): sharing must be stated, never assumed.
    """

    mode: str  # "private" | "shared"
    agent_types: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: str | None) -> SharingPolicy:
        if not raw or not _SHARING_RE.match(raw.strip()):
            return PRIVATE
        raw = raw.strip()
        if raw == "private":
            return PRIVATE
        if raw == "shared":
            return cls("shared")
        return cls("shared", tuple(sorted(set(raw.split(":", 1)[1].split(",")))))

    def render(self) -> str:
        if self.mode == "private":
            return "private"
        return "shared:" + ",".join(self.agent_types) if self.agent_types else "shared"

    def allows(self, *, owner_agent: str, reader_agent: str, reader_agent_type: str) -> bool:
        """Owners and readers are qualified agents (``app/agent``, domain.principal).

        ``shared`` reaches every agent the Casbin policy lets read the category;
        ``shared:types`` only the owner app's own agents of those types, because an
        agent's type is the word of its app, and an app speaks only for its agents.
        """
        if reader_agent and reader_agent == owner_agent:
            return True
        if self.mode != "shared":
            return False
        if not self.agent_types:
            return True
        same_app = _app_part(owner_agent) != "" and _app_part(owner_agent) == _app_part(
            reader_agent
        )
        return same_app and reader_agent_type in self.agent_types


PRIVATE = SharingPolicy("private")


def _app_part(owner: str) -> str:
    """The app of a qualified agent reference ``app/agent`` ("" for a bare agent id)."""
    app_id, separator, _ = owner.partition("/")
    return app_id if separator else ""


# --- Captured interactions -----------------------------------------------------------


@dataclass(frozen=True)
class Interaction:
    """One interaction as an app or agent reports it.

    ``source_ref`` is the caller's own reference for the turn, kept verbatim.
    ``actor`` names who spoke the user side (a person's name in multi-party logs).
    """

    app_id: str
    agent_id: str
    occurred_at: datetime
    user_input: str = ""
    agent_response: str = ""
    session_id: str = ""
    actor: str = ""
    source_ref: str = ""
    purpose: str = "personalization"
    sharing: str = "private"
    agent_type: str = ""
    context: tuple[tuple[str, str], ...] = ()

    def text(self) -> str:
        """The user-side text that extraction and retrieval work on."""
        return self.user_input


@dataclass(frozen=True)
class CapturedInteraction:
    """An interaction after the consent gate accepted it and the log stored it."""

    capture_id: str
    interaction: Interaction


# --- Proposals from extractors and agents --------------------------------------------


@dataclass(frozen=True)
class AttributeProposal:
    key: str
    value: str
    evidence: tuple[str, ...] = ()
    confidence: float = DEFAULT_CONFIDENCE
    explicit: bool = True
    #: The statement says the old value no longer holds ("I moved to Lisbon").
    supersedes: bool = False
    #: Set by the extractor when the statement negates the value ("I no longer eat meat").
    negated: bool = False
    #: Somebody other than the subject said it about the subject ("you're a nurse", said
    #: by another speaker): stored with provenance ``reported``, never ``explicit``.
    reported: bool = False


@dataclass(frozen=True)
class MemoryProposal:
    """A memory in the user's words. ``category`` is its primary (display) category;
    ``categories`` are further ones its proposer knows it reveals. The aggregate adds
    the categories of the same capture's attributes and intents and what the detector
    finds in ``text`` (domain.categories), whatever the proposer said.
    """

    text: str
    evidence: tuple[str, ...] = ()
    category: str = "conversation"
    categories: tuple[str, ...] = ()
    importance: float = 0.5
    source_refs: tuple[str, ...] = ()
    occurred_at: datetime | None = None
    #: [start, end) of ``text`` in the capture's text as the proposer read it, when the
    #: capture was split into several memories (a long turn); None: not known.
    span: tuple[int, int] | None = None


@dataclass(frozen=True)
class IntentProposal:
    description: str
    evidence: tuple[str, ...] = ()
    category: str = "goal"
    confidence: float = DEFAULT_CONFIDENCE
    expires_at: datetime | None = None


@dataclass(frozen=True)
class IntentUpdateProposal:
    """Move an intent along its lifecycle (matched by id, or by description)."""

    status: IntentStatus
    intent_id: str = ""
    description: str = ""
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExperienceProposal:
    """A structured experience memory shared across agents (INMS)."""

    situation: str
    action: str
    outcome: str
    insight: str
    evidence: tuple[str, ...] = ()
    confidence: float = DEFAULT_CONFIDENCE
    #: Categories besides ``experience`` its proposer knows it reveals (detection adds more).
    categories: tuple[str, ...] = ()


Proposal = (
    AttributeProposal | MemoryProposal | IntentProposal | IntentUpdateProposal | ExperienceProposal
)


@dataclass(frozen=True)
class ProposalBatch:
    """Proposals made by one author (extractor or agent) about one subject."""

    proposals: tuple[Proposal, ...]
    author: str
    owner_agent: str
    sharing: str = "private"
    app_id: str = ""
    purpose: str = "personalization"
    extras: dict[str, str] = field(default_factory=dict)


# --- Consent ------------------------------------------------------------------------


@dataclass(frozen=True)
class ConsentGrant:
    """One consent in force: an app may use categories for purposes until expiry."""

    consent_id: str
    app_id: str
    categories: tuple[str, ...]
    purposes: tuple[str, ...]
    legal_basis: str
    granted_at: datetime
    expires_at: datetime | None = None

    def covers(self, *, app_id: str, category: str, purpose: str, at: datetime) -> bool:
        if self.app_id != app_id:
            return False
        if self.expires_at is not None and at >= self.expires_at:
            return False
        if at < self.granted_at:
            return False
        category_ok = "*" in self.categories or category in self.categories
        purpose_ok = "*" in self.purposes or purpose in self.purposes
        return category_ok and purpose_ok
