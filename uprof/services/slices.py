"""Serve a budgeted profile slice: resolve, wait, gate, rank, pack, record.

Order of a request:
1. resolve the subject at the boundary (explicit, session, identifier; never a guess);
2. read-your-writes: wait (bounded) until extraction and projections have passed the
   subject's newest write (other subjects' writes do not hold it up);
3. gate every item: Casbin policy (app × category × purpose, deny by default),
   the subject's consent for that app in force now, and the visibility rule
   (private items only to their owner agent);
4. rank and pack under the token budget (uprof.retrieval);
5. record the read as a ``SliceServed`` event and an audit entry (uprof.services.reads).

What a read needs of a subject (its consents, its items, the memory index) is cached
per subject under the log position of the subject's newest write: any write moves
that position, so a cached view is never older than the writes a read must reflect.

Items withheld by the gate are reported as counts per reason, never by id: a
caller must not learn that an item it may not see exists.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache
from typing import Any, Protocol
from uuid import UUID

import numpy as np

from domain.errors import (
    AmbiguousIdentityError,
    InvalidInputError,
    SubjectErasedError,
    SubjectNotFoundError,
    UprofError,
)
from domain.heat import heat
from domain.principal import qualified_agent
from domain.values import CATEGORIES, Layer, Provenance, SharingPolicy, check_token
from projections.profile.queries import MemoryRow
from uprof import telemetry
from uprof.caching import BoundedCache, CacheStats
from uprof.ports import Clock, Embedder, EventStore, TokenCounter, ViewStore
from uprof.retrieval import (
    Candidate,
    LeftOut,
    MemoryIndex,
    PackedSlice,
    ProfileLines,
    SliceOptions,
    build_slice,
)
from uprof.services.memory_gate import RevealGate
from uprof.services.reads import ReadRecorder, ServedRead
from uprof.services.subjects import SubjectRequest, SubjectResolver

MAX_BUDGET_TOKENS = 32_768
#: Profile items earn their place by matching the query (category, words or meaning);
#: a small base keeps core facts for open queries without crowding out relevant ones.
SLICE_OPTIONS = SliceOptions(attribute_base_utility=0.03, intent_base_utility=0.05)
MAX_QUERY_CHARS = 4_000
#: A read may reuse a subject lookup this recent (erasures here evict it at once).
HANDLE_MAX_AGE_S = 2.0
#: Subjects whose read view is kept, and attribute/intent texts whose vector is kept.
MAX_CACHED_SUBJECTS = 128
#: A vector is 1.5 kB (384 float32): 4,096 of them are 6 MB.
MAX_CACHED_TEXTS = 4_096
#: Items (memories, attributes, intents) held by all cached views together: a view
#: weighs one per item, so a few very large subjects cannot hold gigabytes.
MAX_CACHED_VIEW_ITEMS = 200_000


#: Token counts of item lines kept (an int each); lines longer than this are not cached
#: (the whole slice text is counted once per read, and caching it would only churn).
MAX_CACHED_COUNTS = 16_384
MAX_COUNTED_LINE_CHARS = 1_000


class _CachedCounts:
    """A token counter that remembers the counts of short lines (attribute and intent lines).

    Profile lines are the same from read to read, yet each read counted every one of
    them again (issue 15: about 300 counts per slice at 20k memories). Keyed by the
    line's text, so it is flushed with the other text-keyed caches on erasure.
    """

    def __init__(self, counter: TokenCounter) -> None:
        self._counter = counter
        self.cache: BoundedCache[str, int] = BoundedCache(MAX_CACHED_COUNTS, name="line-tokens")

    def count(self, text: str) -> int:
        if len(text) > MAX_COUNTED_LINE_CHARS:
            return self._counter.count(text)
        hit = self.cache.get(text)
        if hit is None:
            ticket = self.cache.ticket()
            hit = self._counter.count(text)
            self.cache.put(text, hit, ticket=ticket)
        return hit

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        batch = getattr(self._counter, "count_batch", None)
        return list(batch(texts)) if callable(batch) else [self._counter.count(t) for t in texts]


class DecisionLike(Protocol):
    # Read-only: decisions are frozen values (policies.AccessDecision).
    @property
    def allowed(self) -> bool: ...

    @property
    def rule(self) -> tuple[str, ...]: ...

    @property
    def reason(self) -> str: ...

    @property
    def store_error(self) -> type[UprofError] | None: ...


class Authorizer(Protocol):
    def decisions_for(
        self, *, app_id: str, tenant: str, action: str, purpose: str, categories: Sequence[str]
    ) -> Mapping[str, DecisionLike]: ...


@dataclass(frozen=True)
class SliceRequest:
    """One app's request. ``app_id`` must come from authentication, never from the body."""

    subject: SubjectRequest
    query: str
    budget_tokens: int
    purpose: str
    app_id: str
    agent_id: str
    agent_type: str = ""
    now: datetime | None = None
    lexical_only: bool = False
    wait_timeout_s: float | None = None
    #: Audit label of the authenticated principal (uprof.facade sets it).
    principal: str = ""
    #: Asked after the read-your-writes wait, before anything is gated or recorded: it
    #: raises when the credential the request came with no longer stands (a key revoked
    #: during a wait of up to ``read_wait_timeout_s``). The edge that authenticated builds it.
    still_authenticated: Callable[[], None] | None = None


@dataclass(frozen=True)
class SliceItem:
    """One item in the slice, with its provenance labels."""

    item_id: str
    layer: str
    category: str
    text: str
    confidence: float
    provenance: str
    status: str
    source_refs: tuple[str, ...]
    evidence: tuple[str, ...]


#: One candidate not in the slice, and why: the engine's own record, passed through
#: as it is (a slice reports hundreds; copying each would cost more than ranking them).
LeftOutItem = LeftOut


@dataclass(frozen=True)
class ProfileSlice:
    """The exact text to inject, what is in it, and what was left out and why."""

    text: str
    n_tokens: int
    budget_tokens: int
    items: tuple[SliceItem, ...]
    left_out: tuple[LeftOutItem, ...]
    withheld: Mapping[str, int]
    fresh: bool
    waited_ms: float
    purpose: str
    app_id: str
    subject_pseudonym: str


@dataclass(frozen=True)
class Freshness:
    """Outcome of the read-your-writes wait for one subject."""

    fresh: bool
    #: Log position of the subject's newest write (the cache key of its view).
    head: int


#: (candidate, owner agent, sharing policy) of an attribute or intent, before the gate.
_Owned = tuple[Candidate, str, str]


@dataclass
class _SubjectView:
    """Everything a read needs of one subject, as of one head of its stream."""

    head: int
    profile: Any  # the aggregate, for consent checks only: never mutated
    attributes: list[_Owned]
    intents: list[_Owned]
    rows: list[MemoryRow]
    vectors: np.ndarray | None
    sessions: dict[str, int]
    indexes: dict[tuple[Any, ...], tuple[MemoryIndex, Counter[str]]] = field(default_factory=dict)
    #: (category, value) of every attribute, superseded ones too: the memory gate
    #: withholds text containing a withheld value (decision 0016).
    attribute_values: list[tuple[str, str]] = field(default_factory=list)
    #: Per set of servable categories: the free-text gate and its verdict per intent.
    reveals: dict[tuple[Any, ...], tuple[RevealGate, dict[str, str]]] = field(default_factory=dict)
    #: Rendered attribute and intent lines with their costs (the view's candidates only).
    profile_lines: ProfileLines | None = None
    #: Stacked vectors of a gated list of attribute or intent texts, per list.
    item_matrices: dict[tuple[str, ...], np.ndarray] = field(default_factory=dict)

    def weight(self) -> int:
        """What the view weighs in the cache's item bound: one per item, plus one."""
        return 1 + len(self.rows) + len(self.attributes) + len(self.intents)


class SliceService:
    def __init__(
        self,
        app: EventStore,
        subjects: SubjectResolver,
        queries: ViewStore,
        authorizer: Authorizer,
        embedder: Embedder,
        counter: TokenCounter,
        clock: Clock,
        reads: ReadRecorder,
        ensure_fresh: Callable[[UUID, float, int | None], Freshness],
        default_wait_s: float,
    ) -> None:
        self._app = app
        self._subjects = subjects
        self._queries = queries
        self._authorizer = authorizer
        self._embedder = embedder
        self._counter = counter
        self._line_counts = _CachedCounts(counter)
        self._clock = clock
        self._reads = reads
        self._ensure_fresh = ensure_fresh
        self._default_wait_s = default_wait_s
        #: stream -> its view at its newest head; bounded twice so memory stays flat: in
        #: subjects, and in items (a 5,000-memory subject holds about 8 MB of vectors).
        self._cache: BoundedCache[str, _SubjectView] = BoundedCache(
            MAX_CACHED_VIEW_ITEMS,
            name="slice-views",
            weigh=_SubjectView.weight,
            max_entries=MAX_CACHED_SUBJECTS,
        )
        #: Vectors of attribute and intent texts; flushed with the rest on erasure.
        self._text_vectors: BoundedCache[str, np.ndarray] = BoundedCache(
            MAX_CACHED_TEXTS, name="text-vectors"
        )

    def flush(self, stream_id: UUID | None = None) -> None:
        """Drop cached memories (all, or one subject's): erasure calls this."""
        # Text vectors are keyed by content, not subject: any erasure drops them all.
        self._text_vectors.clear()
        self._line_counts.cache.clear()
        if stream_id is None:
            self._cache.clear()
        else:
            self._cache.pop(str(stream_id))

    def cache_stats(self) -> list[CacheStats]:
        """Size, bound, hits and misses of the read caches."""
        return [self._cache.stats(), self._text_vectors.stats(), self._line_counts.cache.stats()]

    # ----------------------------------------------------------------- public

    def slice(self, request: SliceRequest) -> ProfileSlice:
        with telemetry.span(
            "uprof.slice", budget_tokens=request.budget_tokens, lexical_only=request.lexical_only
        ) as traced:
            self._check(request)
            traced.set(purpose=request.purpose)  # a checked token from here on
            served = self._slice(request)
            traced.set(
                items=len(served.items),
                n_tokens=served.n_tokens,
                withheld=sum(served.withheld.values()),
                fresh=served.fresh,
                waited_ms=served.waited_ms,
            )
            return served

    def _slice(self, request: SliceRequest) -> ProfileSlice:
        # Agents belong to their app: the reader is the qualified agent (I4), whatever
        # the caller wrote, so "agent:one" of app B is never app A's "agent:one".
        request = replace(request, agent_id=qualified_agent(request.app_id, request.agent_id))
        try:
            handle = self._subjects.resolve(
                request.subject, calling_agent=request.agent_id, max_age_s=HANDLE_MAX_AGE_S
            )
        except AmbiguousIdentityError:
            # "Your names disagree" says that the subject named exists: only to an app
            # holding a consent of it (the rule below); others are told it does not.
            self._refuse_unheld_subject(request)
            raise
        began = time.perf_counter()
        wait = self._default_wait_s if request.wait_timeout_s is None else request.wait_timeout_s
        with telemetry.span("uprof.slice.wait") as waiting:
            cached = self._cached_view(handle.stream_id)
            freshness = self._ensure_fresh(
                handle.stream_id, wait, None if cached is None else cached.head
            )
            waiting.set(fresh=freshness.fresh)
        waited_ms = (time.perf_counter() - began) * 1000
        if request.still_authenticated is not None:
            # Decided at serve time: the key was checked when the request came in, and the
            # wait above may be long; the policy and consent below are decided after it.
            request.still_authenticated()
        # Consent is judged at the real time of the read; ``request.now`` only sets the
        # "present" that ranking measures recency from (benchmarks replay old dialogues).
        real_now = self._clock.now()
        now = request.now or real_now
        with telemetry.span("uprof.slice.view", stage="cached" if cached else "load"):
            view = self._subject_view(handle.stream_id, freshness, cached)
        if not any(c.app_id == request.app_id for c in view.profile.consents.values()):
            # An app that holds no consent of this subject (none granted, or all
            # withdrawn) learns nothing of it: not that it exists, not its pseudonym,
            # not how much the gate withholds. It is answered as an unknown subject.
            raise SubjectNotFoundError("no such subject")

        withheld: Counter[str] = Counter()
        with telemetry.span("uprof.slice.gate") as gating:
            allowed = self._allowed_categories(request, view.profile, real_now)
            attributes = self._gate(view.attributes, request, allowed, withheld)
            intents = self._gate(view.intents, request, allowed, withheld)
            reveal, verdicts = self._reveal_gate(view, allowed)
            intents = self._gate_intent_text(intents, reveal, verdicts, withheld)
            index = self._memory_index(view, request, allowed, now, withheld, reveal)
            gating.set(
                attributes=len(attributes),
                intents=len(intents),
                memories=len(index),
                withheld=sum(withheld.values()),
            )
        query_vector = attribute_vectors = intent_vectors = None
        if not request.lexical_only and (len(index) or attributes or intents):
            with telemetry.span("uprof.slice.embed"):
                query_vector = self._embedder.embed([request.query])[0]
                attribute_vectors = self._item_vectors(attributes, view)
                intent_vectors = self._item_vectors(intents, view)
        packed = build_slice(
            query=request.query,
            attributes=attributes,
            intents=intents,
            memory_index=index,
            budget_tokens=request.budget_tokens,
            counter=self._line_counts,
            query_vector=query_vector,
            now=now,
            options=SLICE_OPTIONS,
            attribute_vectors=attribute_vectors,
            intent_vectors=intent_vectors,
            profile_lines=self._profile_lines(view),
        )
        with telemetry.span("uprof.slice.record", items=len(packed.items)):
            self._record(handle, request, packed, real_now)
        return ProfileSlice(
            text=packed.text,
            n_tokens=packed.n_tokens,
            budget_tokens=request.budget_tokens,
            items=tuple(_item(c) for c in packed.items),
            # The long tail of never-retrieved memories is not listed (it is everything
            # else the reader may see); what was ranked and dropped is, with its reason.
            left_out=packed.ranked_out,
            withheld=dict(withheld),
            fresh=freshness.fresh,
            waited_ms=round(waited_ms, 3),
            purpose=request.purpose,
            app_id=request.app_id,
            subject_pseudonym=handle.pseudonym,
        )

    def _record(
        self, handle: Any, request: SliceRequest, packed: PackedSlice, real_now: datetime
    ) -> None:
        self._reads.record(
            ServedRead(
                stream_id=handle.stream_id,
                pseudonym=handle.pseudonym,
                app_id=request.app_id,
                agent_id=request.agent_id,
                purpose=request.purpose,
                item_ids=tuple(c.item_id for c in packed.items),
                served_at=real_now,
                budget_tokens=request.budget_tokens,
                n_tokens=packed.n_tokens,
                principal=request.principal,
            )
        )

    def _profile_lines(self, view: _SubjectView) -> ProfileLines:
        """The view's cache of rendered profile lines (made on the view's first read)."""
        lines = view.profile_lines
        if lines is None:
            lines = view.profile_lines = ProfileLines(self._line_counts)
        return lines

    def _item_vectors(
        self, candidates: Sequence[Candidate], view: _SubjectView | None = None
    ) -> np.ndarray | None:
        """Embeddings of attribute/intent texts, cached by text (they change rarely).

        The stacked matrix of a gated list is kept with the subject's view too: the same
        reader gets the same list on every read, and stacking a few hundred cached
        vectors per read cost more than scoring them.
        """
        if not candidates:
            return None
        key = tuple(c.text for c in candidates)
        if view is not None:
            stacked = view.item_matrices.get(key)
            if stacked is not None:
                return stacked
        ticket = self._text_vectors.ticket()
        found = {c.text: self._text_vectors.get(c.text) for c in candidates}
        missing = [text for text, vector in found.items() if vector is None]
        if missing:
            fresh = dict(zip(missing, self._embedder.embed(missing), strict=True))
            found.update(fresh)
            self._text_vectors.put_many(fresh.items(), ticket=ticket)
        vectors: list[np.ndarray] = []
        for c in candidates:
            vector = found[c.text]
            assert vector is not None  # every missing text was embedded above
            vectors.append(vector)
        stacked = np.stack(vectors)
        stacked.flags.writeable = False  # shared by later reads
        if view is not None:
            if len(view.item_matrices) >= 8:  # a handful of readers per subject
                view.item_matrices.clear()
            view.item_matrices[key] = stacked
        return stacked

    # ----------------------------------------------------------------- gating

    @staticmethod
    def _check(request: SliceRequest) -> None:
        if not 0 <= request.budget_tokens <= MAX_BUDGET_TOKENS:
            raise InvalidInputError(
                f"budget_tokens must be between 0 and {MAX_BUDGET_TOKENS}", field="budget_tokens"
            )
        if len(request.query) > MAX_QUERY_CHARS:
            raise InvalidInputError(
                f"query must be at most {MAX_QUERY_CHARS} characters", field="query"
            )
        for name in ("app_id", "agent_id", "purpose"):
            check_token(name, getattr(request, name))
        if request.agent_type:
            check_token("agent_type", request.agent_type)

    def _allowed_categories(
        self, request: SliceRequest, profile: Any, now: datetime
    ) -> dict[str, str]:
        """Category -> "" when servable, else the reason it is withheld."""
        decisions = self._authorizer.decisions_for(
            app_id=request.app_id,
            tenant=self._subjects.tenant,
            action="read",
            purpose=request.purpose,
            categories=list(CATEGORIES),
        )
        for unanswered in decisions.values():
            if unanswered.store_error is not None:
                # The policy store could not be read: every category is denied, and the
                # slice would be 200 with nothing in it, which an agent takes for a
                # profile with nothing to tell. Refused as the outage it is (503, or the
                # store's damage), before anything is recorded (bug OL).
                raise unanswered.store_error(unanswered.reason)
        verdict = {}
        for category in CATEGORIES:
            decision = decisions.get(category)
            if decision is None or not decision.allowed:
                verdict[category] = "policy"
            elif not profile.has_consent(
                app_id=request.app_id, category=category, purpose=request.purpose, at=now
            ):
                verdict[category] = "consent"
            else:
                verdict[category] = ""
        return verdict

    @staticmethod
    def _visible(owner: str, sharing: str, request: SliceRequest) -> bool:
        """I4: private items only to their owner agent; bad or missing policy = private."""
        return _sharing_policy(sharing).allows(
            owner_agent=owner, reader_agent=request.agent_id, reader_agent_type=request.agent_type
        )

    def _gate(
        self,
        pairs: list[_Owned],
        request: SliceRequest,
        allowed: dict[str, str],
        withheld: Counter[str],
    ) -> list[Candidate]:
        kept = []
        for candidate, owner, sharing in pairs:
            reason = allowed.get(candidate.category, "policy")
            if not reason and not self._visible(owner, sharing, request):
                reason = "visibility"
            if reason:
                withheld[reason] += 1
            else:
                kept.append(candidate)
        return kept

    # ------------------------------------------------------------ subject view

    def _refuse_unheld_subject(self, request: SliceRequest) -> None:
        """SubjectNotFoundError unless the request's app holds a consent (not withdrawn)
        of the subject the request names explicitly (read from its stream, no view)."""
        named = request.subject.subject
        if not named:
            return  # a session and an identifier of the app's own disagree
        handle = self._subjects.find(named)
        if handle is None:
            raise SubjectNotFoundError("no such subject")
        profile = self._app.load(handle.stream_id)
        if not any(c.app_id == request.app_id for c in profile.consents.values()):
            raise SubjectNotFoundError("no such subject")

    def _cached_view(self, stream_id: UUID) -> _SubjectView | None:
        """The subject's cached view, if any, marked as the most recently read."""
        stream = str(stream_id)
        return self._cache.get(stream)

    def _subject_view(
        self, stream_id: UUID, freshness: Freshness, cached: _SubjectView | None
    ) -> _SubjectView:
        """The subject's view at its newest head, cached while that head stands.

        A read that timed out waiting is served from the views as they are and its
        view is not cached: its head is ahead of what the views hold.
        """
        stream = str(stream_id)
        if freshness.fresh and cached is not None and cached.head == freshness.head:
            return cached
        # Taken before the load: an erasure flushing this subject meanwhile wins.
        ticket = self._cache.ticket()
        view = self._load_view(stream_id, freshness.head)
        if freshness.fresh:
            self._cache.put(stream, view, ticket=ticket)
        return view

    def _load_view(self, stream_id: UUID, head: int) -> _SubjectView:
        stream = str(stream_id)
        try:
            profile = self._app.load(stream_id)
        except SubjectErasedError:
            self._subjects.forget(stream_id)  # erased elsewhere since it was looked up
            raise
        rows, vectors = self._queries.memories(stream, with_vectors=True)
        # capture id -> the caller's source refs of that capture (from the memory citing it)
        refs = {e: m.source_refs for m in rows if m.source_refs for e in m.evidence}
        every_attribute = self._queries.attributes(stream, include_superseded=True)
        return _SubjectView(
            head=head,
            profile=profile,
            attributes=[
                self._attribute(a, refs) for a in every_attribute if a.status != "superseded"
            ],
            attribute_values=[(a.category, a.value) for a in every_attribute],
            intents=[self._intent(i, refs) for i in self._queries.intents(stream, status="active")],
            rows=rows,
            vectors=vectors,
            sessions=self._queries.session_activity(stream) if rows else {},
        )

    @staticmethod
    def _reveal_gate(
        view: _SubjectView, allowed: dict[str, str]
    ) -> tuple[RevealGate, dict[str, str]]:
        """What free text may not reveal to this reader (decision 0016), cached per view."""
        key = tuple(sorted(allowed.items()))
        hit = view.reveals.get(key)
        if hit is None:
            gate = RevealGate.build(
                allowed,
                items=[(c.category, c.evidence) for c, _, _ in (*view.attributes, *view.intents)],
                # Attribute values (superseded too) and active intents' descriptions.
                values=[
                    *view.attribute_values,
                    *((c.category, c.text) for c, _, _ in view.intents),
                ],
            )
            if len(view.reveals) >= 8:
                view.reveals.clear()
            hit = view.reveals[key] = (gate, {})
        return hit

    @staticmethod
    def _gate_intent_text(
        intents: list[Candidate],
        reveal: RevealGate,
        verdicts: dict[str, str],
        withheld: Counter[str],
    ) -> list[Candidate]:
        """Withhold intents whose words reveal a withheld category or value."""
        kept = []
        for c in intents:
            reason = verdicts.get(c.item_id)
            if reason is None:
                reason = verdicts[c.item_id] = reveal.reason(
                    (c.category,), c.evidence, (c.text,), detect=True, link=False
                )
            if reason:
                withheld[reason] += 1
            else:
                kept.append(c)
        return kept

    def _memory_index(
        self,
        view: _SubjectView,
        request: SliceRequest,
        allowed: dict[str, str],
        now: datetime,
        withheld: Counter[str],
        reveal: RevealGate | None = None,
    ) -> MemoryIndex:
        # The gate's outcome depends only on the reader, the servable categories and the
        # subject's view: cache it with the index, so a repeated read skips 5k checks.
        reader = (
            request.agent_id,
            request.agent_type,
            tuple(sorted(allowed.items())),
            request.lexical_only,
        )
        hit = view.indexes.get(reader)
        if hit is not None:
            index, cached_counts = hit
            withheld.update(cached_counts)
            return index
        counts: Counter[str] = Counter()
        keep: list[int] = []
        # Served only if every category the memory reveals is servable (decision 0016).
        reveal = reveal or self._reveal_gate(view, allowed)[0]
        for i, m in enumerate(view.rows):
            reason = reveal.reason(m.categories or (m.category,), m.evidence, (m.text,))
            if not reason and not self._visible(m.owner_agent, m.sharing, request):
                reason = "visibility"
            if reason:
                counts[reason] += 1
            else:
                keep.append(i)
        candidates = [_memory_candidate(view.rows[i], view.sessions, now) for i in keep]
        # A speaker label naming a withheld value (the user's withheld name) is dropped.
        candidates = [
            replace(c, actor="") if c.actor and reveal.hides(c.actor) else c for c in candidates
        ]
        vectors = None
        if view.vectors is not None and not request.lexical_only:
            vectors = view.vectors[keep] if keep else view.vectors[:0]
        index = MemoryIndex.build(candidates, vectors, self._counter)
        # Keep a handful of reader views per subject; more readers rebuild on demand.
        if len(view.indexes) >= 8:
            view.indexes.clear()
        view.indexes[reader] = (index, counts)
        withheld.update(counts)
        return index

    # ------------------------------------------------------------- conversions

    @staticmethod
    def _attribute(a: Any, refs: Mapping[str, tuple[str, ...]]) -> _Owned:
        label = a.key.replace("_", " ")
        return (
            Candidate(
                item_id=a.item_id,
                layer=Layer.ATTRIBUTE,
                category=a.category,
                text=f"{label}: {a.value}",
                confidence=a.confidence,
                provenance=Provenance(a.provenance),
                evidence=a.evidence,
                source_refs=_refs_of(a.evidence, refs),
                occurred_at=a.last_observed_at,
                status=a.status,
            ),
            a.owner_agent,
            a.sharing,
        )

    @staticmethod
    def _intent(i: Any, refs: Mapping[str, tuple[str, ...]]) -> _Owned:
        return (
            Candidate(
                item_id=i.item_id,
                layer=Layer.INTENT,
                category=i.category,
                text=i.description,
                confidence=i.confidence,
                provenance=Provenance(i.provenance),
                evidence=i.evidence,
                source_refs=_refs_of(i.evidence, refs),
                occurred_at=i.observed_at,
                status=i.status,
            ),
            i.owner_agent,
            i.sharing,
        )


@lru_cache(maxsize=256)
def _sharing_policy(raw: str) -> SharingPolicy:
    """A stored sharing policy, parsed once: every read checks every item's (a few distinct
    words such as "shared" or "private", never personal data)."""
    return SharingPolicy.parse(raw)


def _refs_of(evidence: Sequence[str], refs: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The callers' own references of the captured events an item cites, in order."""
    return tuple(dict.fromkeys(r for e in evidence for r in refs.get(e, ())))


def _memory_candidate(m: MemoryRow, sessions: Mapping[str, int], now: datetime) -> Candidate:
    return Candidate(
        item_id=m.item_id,
        layer=Layer.MEMORY,
        category=m.category,
        text=m.text,
        # A memory is a record of what was said: certain when it cites its event; its
        # importance only steers ranking (through heat), never the label.
        confidence=1.0 if m.provenance == Provenance.EXPLICIT else m.importance,
        provenance=Provenance(m.provenance),
        evidence=m.evidence,
        source_refs=m.source_refs,
        occurred_at=m.occurred_at,
        actor=m.actor,
        heat=heat(
            visits=m.visits,
            interactions=sessions.get(m.session_key, 0),
            last_touched=m.last_visited_at or m.occurred_at,
            now=now,
        ),
    )


def _item(c: Candidate) -> SliceItem:
    return SliceItem(
        item_id=c.item_id,
        layer=str(c.layer),
        category=c.category,
        text=c.text,
        confidence=round(c.confidence, 4),
        provenance=str(c.provenance),
        status=c.status,
        source_refs=c.source_refs,
        evidence=c.evidence,
    )
