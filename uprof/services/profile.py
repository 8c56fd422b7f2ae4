"""Reading a subject's profile: now, as it stood at an earlier time, and the evidence."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import sqlalchemy as sa
from eventsourcing.domain import DomainEvent

from domain.errors import InvalidInputError, ItemNotFoundError, SubjectNotFoundError
from domain.profile import SubjectProfile
from projections.profile import tables as t
from projections.profile.projector import ProfileProjector
from projections.profile.queries import (
    AttributeRow,
    CaptureRow,
    ConsentRow,
    IntentRow,
    MemoryRow,
)
from projections.profile.sealing import FieldSealer
from projections.profile.views import SqlViewStore
from uprof.ports import EventStore, ViewStore


@dataclass(frozen=True)
class ProfileView:
    """A subject's three layers plus consents, each item with its evidence ids."""

    stream_id: str
    attributes: tuple[AttributeRow, ...]
    memories: tuple[MemoryRow, ...]
    intents: tuple[IntentRow, ...]
    consents: tuple[ConsentRow, ...]
    as_of: datetime | None = None


@dataclass(frozen=True)
class EvidenceView:
    """One item and the captured events it came from."""

    item_id: str
    layer: str
    summary: str
    captures: tuple[CaptureRow, ...]


def read_profile(
    queries: ViewStore,
    stream_id: str,
    as_of: datetime | None,
    *,
    with_memories: bool = True,
) -> ProfileView:
    """The subject's profile; ``with_memories=False`` leaves the memories out (a caller
    that pages them, whose count grows without bound, reads them with ``memories_after``)."""
    memories = queries.memories(stream_id, include_archived=True)[0] if with_memories else []
    return ProfileView(
        stream_id=stream_id,
        attributes=tuple(queries.attributes(stream_id)),
        memories=tuple(memories),
        intents=tuple(queries.intents(stream_id)),
        consents=tuple(queries.consents(stream_id)),
        as_of=as_of,
    )


class ProfileService:
    def __init__(self, app: EventStore, queries: ViewStore, sealer: FieldSealer) -> None:
        self._app = app
        self._queries = queries
        self._sealer = sealer

    def current(self, stream_id: UUID, *, with_memories: bool = True) -> ProfileView:
        return read_profile(self._queries, str(stream_id), None, with_memories=with_memories)

    def as_of(self, stream_id: UUID, when: datetime) -> ProfileView:
        """Replay the subject's events recorded up to ``when`` into a scratch read model.

        The same projector builds it as builds the live views, so "then" and "now"
        can never be computed by two different sets of rules.
        """
        if when.tzinfo is None:
            raise InvalidInputError("as_of must carry a timezone")
        # Loaded first, for its checks alone: ``stream_events`` reads no anchor, and a
        # stream cut below it would replay as if its last events never happened (bug GP).
        self._app.load(stream_id)
        stored = self._app.stream_events(stream_id)
        if not stored:
            raise SubjectNotFoundError("no such subject stream")
        events = []
        for position, event in enumerate(stored, start=1):
            # The mapper types events by protocol; the profile's are DomainEvents (timed).
            assert isinstance(event, DomainEvent)
            if isinstance(event, SubjectProfile.ContentShredded):
                continue
            # An erasure holds for the past too: a history read from before an item's
            # erasure must not serve the item again (bug JV), so every ``ItemsErased`` is
            # replayed, at its place in the stream, whenever it was written.
            if event.timestamp > when and not isinstance(event, SubjectProfile.ItemsErased):
                continue
            events.append((position, event))
        scratch = sa.create_engine("sqlite://")
        try:
            t.metadata.create_all(scratch)
            model = SqlViewStore(
                scratch, self._sealer, ProfileProjector(embedder=None, sealer=self._sealer)
            )
            model.apply_batch(self._app.name, events, len(stored), vectors={})
            return read_profile(model, str(stream_id), when)
        finally:
            scratch.dispose()

    def evidence(self, stream_id: UUID, item_id: str) -> EvidenceView:
        """Show the captured events behind one item of this subject."""
        sid = str(stream_id)
        found: tuple[str, str, tuple[str, ...]] | None = None
        for a in self._queries.attributes(sid):
            if a.item_id == item_id:
                found = ("attribute", f"{a.key} = {a.value}", a.evidence)
        for i in self._queries.intents(sid):
            if i.item_id == item_id:
                found = ("intent", i.description, i.evidence)
        if found is None:
            memories, _ = self._queries.memories(sid, include_archived=True)
            for m in memories:
                if m.item_id == item_id:
                    found = ("memory", m.text, m.evidence)
        if found is None:
            raise ItemNotFoundError(item_id)
        layer, summary, evidence = found
        rows = self._queries.captures(evidence)
        # Only this subject's captures, in the order the item cites them (I5).
        captures = tuple(rows[e] for e in evidence if e in rows and rows[e].stream_id == sid)
        return EvidenceView(item_id, layer, summary, captures)
