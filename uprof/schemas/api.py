"""Wire models of the service surfaces (REST, SDK, MCP), validated strictly.

Rules that hold for every request model here:

- ``extra="forbid"``: an unknown field is refused (422) instead of ignored. In
  particular no request carries ``app_id``: the app is the one its API key
  authenticates (I3), so a body that tries to name an app is rejected.
- Every request that concerns a data subject names it in the JSON body, never in
  the URL: URLs end up in access logs, proxies and browser history, and a subject
  reference (an e-mail, a handle) is personal data.
- Text fields refuse NUL characters and lone surrogates: PostgreSQL cannot store
  the first, UTF-8 cannot encode the second, and a capture that the log accepts but
  a projection cannot write would stall the pipeline.

The SDK re-exports the response models, so they double as its typed results.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from audit.export_format import checked_lines, export_frame
from domain.values import ATTRIBUTE_KEYS, CATEGORIES, check_sharing, text_problem

# Re-exported: the surfaces (routes, MCP) read the page bounds from the wire schemas.
from uprof.services.paging import DEFAULT_PAGE_LIMIT as DEFAULT_PAGE_LIMIT
from uprof.services.paging import MAX_CURSOR_CHARS as MAX_CURSOR_CHARS
from uprof.services.paging import MAX_PAGE_LIMIT as MAX_PAGE_LIMIT

#: Most interactions accepted in one batch request (the kernel allows more; a request
#: body is capped in bytes too, see uprof.api.limits).
MAX_BATCH_INTERACTIONS = 1_000
#: Most proposals in one request.
MAX_PROPOSALS = 256
#: Same bounds as the slice service (uprof.services.slices); repeated here so the
#: OpenAPI schema states them.
MAX_BUDGET_TOKENS = 32_768
MAX_QUERY_CHARS = 4_000
MAX_TEXT_CHARS = 32_000


def _no_nul(value: str) -> str:
    """Refuse NUL characters and lone surrogates: neither survives storage as text."""
    problem = text_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return value


def _utc(value: datetime) -> datetime:
    # Converting at the edge means a time at the very ends of the calendar (year 1
    # with a positive offset) is refused here as bad input, not deep inside.
    try:
        return value.astimezone(UTC)
    except (OverflowError, ValueError):
        raise ValueError("is outside the supported range of times") from None


Text = Annotated[str, AfterValidator(_no_nul)]
#: Ids that the audit log records (agents, purposes, legal bases) must be audit tokens:
#: refusing anything else here means the kernel never stores an event whose audit
#: entry would then be refused (audit/entry.py, _TOKEN_RE).
TOKEN_PATTERN = r"^[A-Za-z0-9_.:/*#=\-]+$"
AgentId = Annotated[str, Field(min_length=1, max_length=128, pattern=TOKEN_PATTERN)]
AgentType = Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z0-9_.:/*#=\-]*$")]
Token = Annotated[str, Field(min_length=1, max_length=64, pattern=TOKEN_PATTERN)]
SubjectRef = Annotated[
    str, Field(min_length=1, max_length=256), AfterValidator(_no_nul), AfterValidator(_not_blank)
]
Purpose = Token
UtcTime = Annotated[AwareDatetime, AfterValidator(_utc)]
if TYPE_CHECKING:
    # The closed sets come from the catalogue when the module runs (an enum in the JSON
    # Schema, checked by pydantic); a type checker cannot evaluate them, so to it they
    # are strings.
    Category = str
    ConsentCategory = str
    AttributeKey = str
else:
    Category = Literal[CATEGORIES]
    ConsentCategory = Literal[(*CATEGORIES, "*")]
    AttributeKey = Literal[tuple(sorted(ATTRIBUTE_KEYS))]
#: Who besides the owner agent may see an item (domain.values.SharingPolicy).
Sharing = Annotated[str, Field(max_length=256), AfterValidator(check_sharing)]
Confidence = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
EvidenceIds = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_no_nul)]],
    Field(max_length=32),
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _example(example: dict[str, Any]) -> ConfigDict:
    """A request model's config with one example body, shown in the OpenAPI document.

    Placeholders in angle brackets stand for ids a previous answer returns; everything
    else is a valid request as it stands (tests/api/test_openapi_examples.py posts them).
    """
    return ConfigDict(extra="forbid", json_schema_extra={"examples": [example]})


class _Response(BaseModel):
    # Responses tolerate new fields, so an older SDK keeps working against a newer server.
    model_config = ConfigDict(extra="ignore")


# ------------------------------------------------------------------------- pages

#: The ``next_cursor`` of the previous page, sent back unchanged (with the same filters).
Cursor = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_CURSOR_CHARS,
        description=(
            "Continue after the previous page: its next_cursor, unchanged, with the same "
            "filters. Leave it out for the first page. A cursor issued to another app, for "
            "another subject or other filters, or altered, is a 422 naming cursor."
        ),
    ),
]
PageLimit = Annotated[
    int,
    Field(
        ge=1,
        le=MAX_PAGE_LIMIT,
        description=f"Most items on this page (1 to {MAX_PAGE_LIMIT}; default "
        f"{DEFAULT_PAGE_LIMIT}).",
    ),
]
NextCursor = Annotated[
    str | None,
    Field(description="Send it back as cursor for the next page; null on the last page."),
]


class _Page(_Response):
    """A page of a list: its items and the cursor of the next page (None on the last)."""

    #: The field holding the page's items.
    _items_field: ClassVar[str] = "items"
    next_cursor: NextCursor = None

    def items_page(self) -> tuple[list[Any], str | None]:
        """The items and the next cursor, for code that follows pages generically."""
        return list(getattr(self, self._items_field)), self.next_cursor


# ----------------------------------------------------------------------- capture


def _refused_field(model: BaseModel, field: str, message: str) -> ValidationError:
    """The refusal of a check across fields (a model validator), located at ``field``,
    the one its message asks for first. A ``ValueError`` there is located at the model
    itself, which REST, MCP and the SDK all report as the field ``body``: no argument an
    MCP tool takes, nor a field of the JSON a REST caller sent (review of 0186 and 0188,
    bug OY). Nested models keep their place (``interactions.0.user_input``)."""
    detail = InitErrorDetails(
        type=PydanticCustomError("value_error", message), loc=(field,), input=None
    )
    return ValidationError.from_exception_data(type(model).__name__, [detail])


class InteractionBody(_Request):
    """One interaction as an app reports it; the app comes from the API key."""

    agent_id: AgentId
    agent_type: AgentType = ""
    user_input: Annotated[Text, Field(max_length=MAX_TEXT_CHARS)] = ""
    agent_response: Annotated[Text, Field(max_length=MAX_TEXT_CHARS)] = ""
    occurred_at: UtcTime
    session_id: Annotated[Text, Field(max_length=128)] = ""
    actor: Annotated[Text, Field(max_length=128)] = ""
    source_ref: Annotated[Text, Field(max_length=256)] = ""
    purpose: Purpose = "personalization"
    sharing: Sharing = "private"
    context: Annotated[
        dict[
            Annotated[str, Field(max_length=64), AfterValidator(_no_nul)],
            Annotated[str, Field(max_length=1024), AfterValidator(_no_nul)],
        ],
        Field(max_length=64),
    ] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _has_text(self) -> InteractionBody:
        if not (self.user_input.strip() or self.agent_response.strip()):
            raise _refused_field(self, "user_input", "user_input or agent_response must hold text")
        return self


class CaptureIn(InteractionBody):
    """Capture one interaction about ``subject``."""

    model_config = _example(
        {
            "subject": "alice@example.com",
            "agent_id": "agent:planner",
            "user_input": "I moved to Lisbon last spring and I'm learning the cello.",
            "agent_response": "Nice! Want me to find cello teachers in Lisbon?",
            "occurred_at": "2026-11-30T09:30:00Z",
            "session_id": "s-2041",
            "source_ref": "chat:2041:7",
            "purpose": "personalization",
            "sharing": "shared",
        }
    )

    subject: SubjectRef


class CaptureBatchIn(_Request):
    """Capture several interactions about one subject, all or nothing."""

    model_config = _example(
        {
            "subject": "alice@example.com",
            "interactions": [
                {
                    "agent_id": "agent:planner",
                    "user_input": "I'm vegetarian.",
                    "occurred_at": "2026-11-30T09:30:00Z",
                    "sharing": "shared",
                },
                {
                    "agent_id": "agent:planner",
                    "user_input": "Book somewhere quiet for Friday.",
                    "occurred_at": "2026-11-30T09:31:00Z",
                },
            ],
        }
    )

    subject: SubjectRef
    interactions: Annotated[
        list[InteractionBody], Field(min_length=1, max_length=MAX_BATCH_INTERACTIONS)
    ]


class CaptureAck(_Response):
    """Ids the app can cite later as evidence."""

    capture_id: str
    notification_id: int
    subject_pseudonym: str


class CaptureBatchAck(_Response):
    acks: list[CaptureAck]


# --------------------------------------------------------------------- proposals


class AttributeProposalIn(_Request):
    kind: Literal["attribute"] = "attribute"
    key: AttributeKey
    value: Annotated[Text, Field(min_length=1, max_length=512), AfterValidator(_not_blank)]
    evidence: EvidenceIds = Field(default_factory=list)
    confidence: Confidence = 0.6
    explicit: bool = True
    supersedes: bool = False
    negated: bool = False


class MemoryProposalIn(_Request):
    kind: Literal["memory"] = "memory"
    text: Annotated[Text, Field(min_length=1, max_length=4_000), AfterValidator(_not_blank)]
    evidence: EvidenceIds = Field(default_factory=list)
    category: Category = "conversation"
    importance: Confidence = 0.5
    source_refs: Annotated[list[Annotated[Text, Field(max_length=256)]], Field(max_length=32)] = (
        Field(default_factory=list)
    )
    occurred_at: UtcTime | None = None


class IntentProposalIn(_Request):
    kind: Literal["intent"] = "intent"
    description: Annotated[Text, Field(min_length=1, max_length=1_000), AfterValidator(_not_blank)]
    evidence: EvidenceIds = Field(default_factory=list)
    category: Category = "goal"
    confidence: Confidence = 0.6
    expires_at: UtcTime | None = None


class IntentUpdateIn(_Request):
    kind: Literal["intent_update"] = "intent_update"
    status: Literal["active", "fulfilled", "abandoned", "expired"]
    intent_id: Annotated[Text, Field(max_length=64)] = ""
    description: Annotated[Text, Field(max_length=1_000)] = ""
    evidence: EvidenceIds = Field(default_factory=list)

    @model_validator(mode="after")
    def _names_an_intent(self) -> IntentUpdateIn:
        if not (self.intent_id.strip() or self.description.strip()):
            raise _refused_field(self, "intent_id", "intent_id or description must name the intent")
        return self


class ExperienceProposalIn(_Request):
    kind: Literal["experience"] = "experience"
    situation: Annotated[Text, Field(min_length=1, max_length=2_000)]
    action: Annotated[Text, Field(min_length=1, max_length=2_000)]
    outcome: Annotated[Text, Field(min_length=1, max_length=2_000)]
    insight: Annotated[Text, Field(min_length=1, max_length=2_000)]
    evidence: EvidenceIds = Field(default_factory=list)
    confidence: Confidence = 0.6


ProposalIn = Annotated[
    AttributeProposalIn
    | MemoryProposalIn
    | IntentProposalIn
    | IntentUpdateIn
    | ExperienceProposalIn,
    Field(discriminator="kind"),
]


class ProposalsIn(_Request):
    """Structured proposals by one agent about one subject, bound to evidence by the kernel."""

    model_config = _example(
        {
            "subject": "alice@example.com",
            "agent_id": "agent:planner",
            "sharing": "shared",
            "proposals": [
                {
                    "kind": "attribute",
                    "key": "diet",
                    "value": "vegetarian",
                    "evidence": ["<capture_id from a capture>"],
                    "confidence": 0.9,
                },
                {
                    "kind": "intent",
                    "description": "find a cello teacher in Lisbon",
                    "category": "goal",
                },
            ],
        }
    )

    subject: SubjectRef
    agent_id: AgentId
    sharing: Sharing = "private"
    purpose: Purpose = "personalization"
    observed_at: UtcTime | None = None
    proposals: Annotated[list[ProposalIn], Field(min_length=1, max_length=MAX_PROPOSALS)]


class ProposalsResult(_Response):
    applied: int


# ------------------------------------------------------------------------ slices


class SliceIn(_Request):
    """Ask for the slice of a profile this app may see for a query, within a budget.

    Name the subject directly, or by a session or identifier this app registered;
    sources that disagree are an error, never a guess.
    """

    model_config = _example(
        {
            "subject": "alice@example.com",
            "query": "Where should we book dinner on Friday?",
            "budget_tokens": 512,
            "purpose": "personalization",
            "agent_id": "agent:planner",
        }
    )

    #: The names of the subject the caller can send, as its "name the subject" refusal
    #: lists them: a surface taking fewer says so (the MCP tool takes no identifier).
    _subject_names: ClassVar[tuple[str, ...]] = ("subject", "session_id", "identifier")

    subject: SubjectRef | None = None
    session_id: Annotated[Text, Field(min_length=1, max_length=128)] | None = None
    identifier: Annotated[Text, Field(min_length=1, max_length=256)] | None = None
    query: Annotated[Text, Field(max_length=MAX_QUERY_CHARS)]
    budget_tokens: Annotated[int, Field(ge=0, le=MAX_BUDGET_TOKENS)]
    purpose: Purpose
    agent_id: AgentId
    agent_type: AgentType = ""
    lexical_only: bool = False
    wait_timeout_s: Annotated[float, Field(ge=0.0, le=30.0, allow_inf_nan=False)] | None = None

    @model_validator(mode="after")
    def _names_someone(self) -> SliceIn:
        if not (self.subject or self.session_id or self.identifier):
            *others, last = self._subject_names
            names = f"{', '.join(others)} or {last}"
            raise _refused_field(self, "subject", f"name the subject: {names}")
        return self


class SliceItem(_Response):
    item_id: str
    layer: str
    category: str
    text: str
    confidence: float
    provenance: str
    status: str
    source_refs: list[str]
    evidence: list[str]


class LeftOutItem(_Response):
    item_id: str
    layer: str
    reason: str
    detail: str


class ProfileSlice(_Response):
    """The exact text to inject, the items in it, and what was left out and why."""

    text: str
    n_tokens: int
    budget_tokens: int
    items: list[SliceItem]
    left_out: list[LeftOutItem]
    withheld: dict[str, int]
    fresh: bool
    waited_ms: float
    purpose: str
    app_id: str
    subject_pseudonym: str


# ------------------------------------------------------------- profile, evidence


class ProfileIn(_Request):
    model_config = _example({"subject": "alice@example.com"})

    subject: SubjectRef
    as_of: UtcTime | None = None


class AttributeOut(_Response):
    item_id: str
    key: str
    category: str
    value: str
    confidence: float
    provenance: str
    status: str
    conflicts_with: list[str]
    superseded_by: str
    owner_agent: str
    sharing: str
    evidence: list[str]
    first_observed_at: datetime
    last_observed_at: datetime


class MemoryOut(_Response):
    item_id: str
    kind: str
    text: str
    category: str
    importance: float
    provenance: str
    evidence: list[str]
    source_refs: list[str]
    owner_agent: str
    sharing: str
    actor: str
    session_id: str
    occurred_at: datetime
    archived: bool


class IntentOut(_Response):
    item_id: str
    description: str
    category: str
    confidence: float
    provenance: str
    status: str
    evidence: list[str]
    owner_agent: str
    sharing: str
    expires_at: datetime | None
    observed_at: datetime


class Consent(_Response):
    consent_id: str
    app_id: str
    categories: list[str]
    purposes: list[str]
    legal_basis: str
    granted_at: datetime
    expires_at: datetime | None
    withdrawn_at: datetime | None
    erase_requested: bool = False


class Profile(_Response):
    """A subject's three layers and consents, each item with its evidence ids."""

    attributes: list[AttributeOut]
    memories: list[MemoryOut]
    intents: list[IntentOut]
    consents: list[Consent]
    as_of: datetime | None = None


class EvidenceIn(_Request):
    model_config = _example(
        {"subject": "alice@example.com", "item_id": "<item_id from a profile or slice>"}
    )

    subject: SubjectRef
    item_id: Annotated[Text, Field(min_length=1, max_length=64)]


class CapturedEvent(_Response):
    capture_id: str
    app_id: str
    agent_id: str
    session_id: str
    actor: str
    purpose: str
    source_ref: str
    user_input: str
    agent_response: str
    occurred_at: datetime


class Evidence(_Response):
    item_id: str
    layer: str
    summary: str
    captures: list[CapturedEvent]


# ----------------------------------------------------------------------- consent


class ConsentGrantIn(_Request):
    """Record the subject's consent for the calling app (never another app)."""

    model_config = _example(
        {
            "subject": "alice@example.com",
            "categories": ["preference", "diet", "location"],
            "purposes": ["personalization"],
            "collected_by": "consent-ui:2026-11-30:1234",
        }
    )

    subject: SubjectRef
    categories: Annotated[
        list[ConsentCategory], Field(min_length=1, max_length=len(CATEGORIES) + 1)
    ]
    purposes: Annotated[list[Purpose], Field(min_length=1, max_length=16)]
    legal_basis: Token = "consent"
    expires_at: UtcTime | None = None
    #: The app's own record of the user's consent action (required for apps): e.g. the
    #: id of the consent dialog event the user confirmed.
    collected_by: Annotated[
        Token | None,
        Field(
            description="the app's reference to the user's consent action it relies on, "
            "e.g. consent-ui:2024-05-01:1234 (required)",
            examples=["consent-ui:2024-05-01:1234"],
        ),
    ] = None


class ConsentGranted(_Response):
    consent_id: str


class ConsentWithdrawIn(_Request):
    model_config = _example(
        {
            "subject": "alice@example.com",
            "consent_id": "<consent_id from the grant>",
            "erase": False,
        }
    )

    subject: SubjectRef
    consent_id: Annotated[Text, Field(min_length=1, max_length=64)]
    erase: bool = False


class ConsentListIn(_Request):
    model_config = _example({"subject": "alice@example.com", "limit": 50})

    subject: SubjectRef
    cursor: Cursor | None = None
    limit: PageLimit = DEFAULT_PAGE_LIMIT


class ConsentList(_Page):
    """A page of the calling app's consents from the subject, oldest first."""

    _items_field: ClassVar[str] = "consents"
    consents: list[Consent]

    @property
    def items(self) -> list[Consent]:
        return self.consents


class MemoryListIn(_Request):
    model_config = _example({"subject": "alice@example.com", "limit": 50})

    subject: SubjectRef
    cursor: Cursor | None = None
    limit: PageLimit = DEFAULT_PAGE_LIMIT


class MemoryPage(_Page):
    """A page of the subject's memories (archived ones too), oldest first."""

    items: list[MemoryOut]


class SubjectListIn(_Request):
    model_config = _example({"limit": 50})

    cursor: Cursor | None = None
    limit: PageLimit = DEFAULT_PAGE_LIMIT


class SubjectOut(_Response):
    """A live subject by its audit pseudonym (references are never stored, so never listed)."""

    pseudonym: str
    created_at: datetime


class SubjectPage(_Page):
    items: list[SubjectOut]


# ------------------------------------------------------------ identity registries


class SessionIn(_Request):
    """Bind a session of this app to a subject (sessions are scoped to the app)."""

    model_config = _example({"session_id": "s-2041", "subject": "alice@example.com"})

    session_id: Annotated[Text, Field(min_length=1, max_length=128), AfterValidator(_not_blank)]
    subject: SubjectRef


class IdentifierIn(_Request):
    """Record that an identifier this app knows the user by names a subject."""

    model_config = _example({"identifier": "crm:cust-88231", "subject": "alice@example.com"})

    identifier: Annotated[Text, Field(min_length=1, max_length=256), AfterValidator(_not_blank)]
    subject: SubjectRef


class Registered(_Response):
    registered: bool = True


# --------------------------------------------------------------------- operations


class FieldProblem(_Response):
    field: str
    message: str


class ErrorBody(_Response):
    code: str
    message: str
    hint: str = ""
    fields: list[FieldProblem] = Field(default_factory=list)


class ErrorOut(_Response):
    """Every 4xx and 5xx answer has this shape."""

    error: ErrorBody


class Health(_Response):
    status: str


class Readiness(_Response):
    ready: bool
    database: bool
    log_position: int
    extraction_pending: int
    projection_pending: int
    #: Captures set aside after failing extraction on every attempt (they hold nothing
    #: up, so readiness does not depend on them; ``uprof quarantine list`` shows them).
    quarantined: int = 0
    #: This process's pipeline worker: running, failing, stopped; external (``serve
    #: --no-worker``: ``uprof worker`` processes do the work); inline (no worker thread).
    worker: str
    #: ``external`` only: seconds the pending extraction and projection work has not
    #: moved, as this server has seen it (0: nothing pending, or it moved since the last
    #: look); growing means no ``uprof worker`` runs for it. Readiness does not fail on
    #: it: every server of the database would fail alike, captures too (docs/api.md).
    pipeline_unmoved_s: float | None = None
    detail: str = ""


class WhoAmI(_Response):
    """The app and roles an API key stands for."""

    app_id: str
    key_id: str
    roles: list[str]


def field_problems(
    errors: list[dict[str, object]], *, request_parts: bool = False
) -> list[FieldProblem]:
    """Turn pydantic/FastAPI error dicts into field problems with dotted names.

    ``request_parts``: the errors are FastAPI's, whose locations start with the part
    of the request ("body", "query", "path", "header"); that part is dropped, since
    callers think in their JSON's field names (``interactions.0.occurred_at``), not in
    framework terms. Anywhere else (the SDK, the MCP tools) the first part is a field:
    a slice's ``query`` is the field ``query``, not the request's query string.
    """
    problems = []
    for err in errors:
        loc = [str(part) for part in err.get("loc", ()) or ()]  # type: ignore[attr-defined]
        if request_parts and loc and loc[0] in ("body", "query", "path", "header"):
            loc = loc[1:]
        # Discriminated unions add the tag name as a location part; keep it, it names the kind.
        name = ".".join(loc) or "body"
        problems.append(FieldProblem(field=name, message=str(err.get("msg", "invalid"))))
    return problems


# -------------------------------------------------------------------- governance
# Checked by the Casbin policy (actions "erase", purpose "erasure"; "export", purpose
# "access-request"), which the seed grants to role:dpo only.


class SubjectErasureIn(_Request):
    """Erase a subject entirely: tombstone, key destruction, purge, signed receipt."""

    model_config = _example({"subject": "alice@example.com", "basis": "GDPR-Art.17(1)"})

    subject: SubjectRef
    # Not an audit token: the erasure service turns it into one for the audit entry.
    basis: Annotated[Text, Field(min_length=1, max_length=64), AfterValidator(_not_blank)] = (
        "GDPR-Art.17(1)"
    )


class ItemErasureIn(_Request):
    """Erase one profile item (and, if asked, the captured events behind it)."""

    model_config = _example(
        {
            "subject": "alice@example.com",
            "item_id": "<item_id from a profile>",
            "with_evidence": True,
        }
    )

    subject: SubjectRef
    item_id: Annotated[Text, Field(min_length=1, max_length=64)]
    with_evidence: bool = False


class CaptureErasureIn(_Request):
    """Erase one captured event and everything derived only from it."""

    model_config = _example(
        {"subject": "alice@example.com", "capture_id": "<capture_id from a capture>"}
    )

    subject: SubjectRef
    capture_id: Annotated[Text, Field(min_length=1, max_length=64)]


class SubjectExportIn(_Request):
    model_config = _example({"subject": "alice@example.com"})

    subject: SubjectRef


class ErasureReceipt(_Response):
    """The signed receipt (verifiable offline), the subject's nonce, and what was removed."""

    receipt: dict[str, JsonValue]
    subject_nonce_hex: str
    counts: dict[str, int]


class SubjectExport(_Response):
    """Everything held about a subject, with evidence (GDPR Art. 15/20), as portable JSON."""

    export: dict[str, JsonValue]


# ------------------------------------------------------------------------ audit


class AuditExportIn(_Request):
    """Which entries to export; all of them when nothing is named."""

    model_config = _example(
        {"format": "jsonl", "subject": "alice@example.com", "since": "2026-11-01T00:00:00Z"}
    )

    format: Literal["jsonl", "csv"] = "jsonl"
    subject: SubjectRef | None = None
    #: Entries about one app (named ``for_app``: a body never says which app is asking).
    for_app: Token | None = None
    action: Token | None = None
    since: UtcTime | None = None
    until: UtcTime | None = None


class AuditEntriesIn(_Request):
    """Which audit entries to list, a page at a time in leaf order."""

    model_config = _example({"action": "consent.granted", "limit": 50})

    subject: SubjectRef | None = None
    for_app: Token | None = None
    action: Token | None = None
    since: UtcTime | None = None
    until: UtcTime | None = None
    cursor: Cursor | None = None
    limit: PageLimit = DEFAULT_PAGE_LIMIT


class AuditEntryOut(_Response):
    leaf_index: int
    recorded_at: str
    entry: dict[str, Any]


class AuditEntryPage(_Page):
    items: list[AuditEntryOut]


class ReceiptListIn(_Request):
    model_config = _example({"since": "2026-01-01T00:00:00Z", "limit": 50})

    since: UtcTime | None = None
    until: UtcTime | None = None
    cursor: Cursor | None = None
    limit: PageLimit = DEFAULT_PAGE_LIMIT


class ReceiptOut(_Response):
    """An erasure receipt's entry in the log: its id and the SHA-256 of its signed body."""

    leaf_index: int
    recorded_at: str
    receipt_id: str
    receipt_sha256: str


class ReceiptPage(_Page):
    items: list[ReceiptOut]


class AuditExportSummary(_Response):
    tree_size: int
    entry_count: int
    checkpoint: str
    export_sha256: str

    @classmethod
    def of_export(cls, lines: Iterable[str], fmt: str = "jsonl") -> AuditExportSummary:
        """Read the summary from an export file's header and trailer (its lines, in order).

        ``POST /v1/audit/export`` streams the file itself; the SDK rebuilds this summary
        from what it received, streaming too (one record in memory at a time).

        Anything else than an export (what a broken or hostile server may stream) raises
        ``ValueError``: a line over the trail's line cap (``audit.export_format.MAX_LINE_BYTES``;
        the SDK's readers never hold more than the cap of a line, bugs LG and LU), and
        whatever frame the verifier refuses (``audit.export_format.export_frame``: a
        blank line, a header or trailer not in canonical form or ended by ``\\r\\n``,
        a line after the trailer, a last line without its newline; bug OF).
        """
        # Each line checked against the format's cap before csv or json reads it (bug LU);
        # the frame read as the verifier reads it (bug OF).
        header, trailer = export_frame(checked_lines(lines), fmt)
        return cls(
            tree_size=header["tree_size"],
            entry_count=trailer["entry_count"],
            checkpoint=header["checkpoint"],
            export_sha256=trailer["export_sha256"],
        )


class AuditExport(_Response):
    """An export with inclusion proofs and a signed checkpoint: save ``content`` as a file
    and verify it offline with ``uprof audit verify`` and the log's public key.

    The server streams the file (``POST /v1/audit/export``); the SDK assembles this object
    from the stream (``Client.audit_export``), or writes the stream to a file as it comes
    (``Client.audit_export_to``).
    """

    format: str
    content: str
    summary: AuditExportSummary


class AuditVerifyIn(_Request):
    model_config = _example({"kind": "export", "content": "<the content field of an audit export>"})

    kind: Literal["export", "receipt"] = "export"
    content: Annotated[str, Field(min_length=1)]


class AuditVerification(_Response):
    """Verified or not, and where it fails (1-based line, leaf index) when it does."""

    ok: bool
    kind: str
    detail: str
    line_number: int | None = None
    leaf_index: int | None = None
    line_text: str = ""


#: A tree size or leaf index as the log counts them: a JSON integer, never a string or float.
_TreeCount = Annotated[int, Field(strict=True, le=2**63 - 1)]


class AuditProofIn(_Request):
    """What to prove: that the log extends the tree of ``old_size`` entries (the size in
    the checkpoint you hold) and, if asked, that entry ``leaf_index`` is in it."""

    model_config = _example({"old_size": 1})

    old_size: Annotated[_TreeCount, Field(ge=1)]
    leaf_index: Annotated[_TreeCount, Field(ge=0)] | None = None


class AuditConsistency(_Response):
    old_size: int
    hashes: list[str]


class AuditInclusion(_Response):
    leaf_index: int
    entry: dict[str, Any]
    hashes: list[str]


class ReceiptRotationProofIn(_Request):
    """What a rotation proof is asked for: an erasure receipt (its JSON, as issued), or a
    signed checkpoint note (an export's header ``checkpoint``, a proof document's, or the
    export or proof document itself); exactly one of the two."""

    model_config = _example({"receipt": "<the erasure receipt's JSON>"})

    receipt: Annotated[str | None, Field(min_length=1)] = None
    checkpoint: Annotated[str | None, Field(min_length=1, max_length=65536)] = None

    @model_validator(mode="after")
    def _one_of(self) -> ReceiptRotationProofIn:
        if (self.receipt is None) == (self.checkpoint is None):
            raise _refused_field(self, "receipt", "give exactly one of receipt and checkpoint")
        return self


class ReceiptRotationProof(_Response):
    """The log's consistency proof from the receipt's checkpoint (``tree_size``) to the
    point where its issuer key was rotated out (``rotation_point``): save
    ``rotation_proof`` as a JSON file for ``uprof audit verify-receipt --rotation-proof``.
    Both null when the receipt needs none (its key was not rotated out after it). For a
    checkpoint (an export's, a proof document's), ``receipt_id`` is null, ``tree_size``
    the note's, and the file is for ``uprof audit verify --rotation-proof`` or
    ``verify-proof --rotation-proof``."""

    receipt_id: str | None
    issuer_key_id: str
    tree_size: int
    rotation_point: int | None
    rotation_proof: list[str] | None


class AuditProof(_Response):
    """A proof document (``uprof.audit-proof/v1``, docs/audit-format.md §3.1): save the
    response body as it is and check it offline with ``uprof audit verify-proof``."""

    format: str
    origin: str
    key_id: str
    note_key_id: str
    checkpoint: str
    tree_size: int
    consistency: AuditConsistency
    inclusion: AuditInclusion | None


class AuditKey(_Response):
    """What a third party pins to verify exports and receipts offline."""

    origin: str
    key_id: str
    public_key_pem: str
    #: The audit key history (``uprof.audit-key-history/v1``, docs/audit-format.md): every
    #: key the log has signed with, each endorsed by the one before; verifiers pinning an
    #: older key accept the later ones through it. Null where the deployment keeps none.
    key_history: dict[str, Any] | None = None
    #: A fresh signed checkpoint, for callers the policy lets ``audit`` only (its tree
    #: size counts every tenant's entries); null for any other caller.
    checkpoint: str | None = None


class ConsentWithdrawn(_Response):
    """The withdrawn consent, and the erasure receipt when erasure was asked for."""

    consent: Consent
    erasure: ErasureReceipt | None = None
