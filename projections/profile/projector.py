"""Turn profile events into read-model rows, exactly once.

``ProfileProjector.apply_batch`` writes the rows of a batch of notifications and
moves the tracking position in the same transaction (P4): a crash either keeps
both or neither, and a replayed position is skipped. Memory embeddings are
computed here, batched, never on the capture path.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import numpy as np
import sqlalchemy as sa
from eventsourcing.utils import get_topic

from domain.categories import memory_categories
from domain.errors import PositionMovedError, SubjectErasedError
from domain.profile import SubjectProfile as P
from projections.profile import tables as t
from projections.profile.sealing import FieldSealer, context, source_ref_scope

PROJECTION_NAME = "profile"
CAPTURED = get_topic(P.InteractionCaptured)
CAPTURE_ERASED = get_topic(P.CaptureErased)
MEMORY_TOPICS = frozenset(
    get_topic(cls)
    for cls in (P.MemoryRecorded, P.ExperienceRecorded, P.MemoriesArchived, P.ItemsErased)
)


class TextEmbedder(Protocol):
    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def _json(values: Sequence[str]) -> str:
    return json.dumps(list(values), separators=(",", ":"))


def _merge_json(existing: str, extra: Sequence[str]) -> str:
    current = json.loads(existing)
    current.extend(e for e in extra if e not in current)
    return _json(current)


class ProfileProjector:
    """Writes attributes, memories, intents, consents and captures from events."""

    name = PROJECTION_NAME

    def __init__(
        self,
        embedder: TextEmbedder | None,
        sealer: FieldSealer,
        *,
        check_vectors: Callable[[], None] | None = None,
    ) -> None:
        self._embedder = embedder
        #: Raises when vectors of the embedder's model may no longer be written (the
        #: store records another model); asked under the position lock, before any write.
        self._check_vectors = check_vectors
        self._sealer = sealer
        self._handlers: dict[type, Callable[[sa.Connection, int, Any], None]] = {
            P.Registered: self._registered,
            P.InteractionCaptured: self._captured,
            P.ConsentGranted: self._consent_granted,
            P.ConsentWithdrawn: self._consent_withdrawn,
            P.AttributeRecorded: self._attribute_recorded,
            P.AttributeReinforced: self._attribute_reinforced,
            P.AttributeConflictFlagged: self._attribute_conflict,
            P.AttributeSuperseded: self._attribute_superseded,
            P.MemoryRecorded: self._memory_recorded,
            P.ExperienceRecorded: self._experience_recorded,
            P.MemoriesArchived: self._memories_archived,
            P.IntentRecorded: self._intent_recorded,
            P.IntentReinforced: self._intent_reinforced,
            P.IntentStatusChanged: self._intent_status_changed,
            P.SliceServed: self._slice_served,
            P.AttributeRestated: self._attribute_restated,
            P.ItemsErased: self._items_erased,
            P.CaptureErased: self._capture_erased,
            P.SubjectErased: self._subject_erased,
        }
        self._vectors: dict[str, bytes] = {}
        #: Per batch: subject bookkeeping to write once per subject, and the session and
        #: speaker of captures seen in this batch (their memories need them).
        self._touched: dict[str, dict[str, int]] = {}
        self._batch_captures: dict[str, tuple[str, str, str]] = {}

    # ----------------------------------------------------------------- batches

    def position(
        self, conn: sa.Connection, application_name: str, projection_name: str | None = None
    ) -> int:
        row = conn.execute(
            sa.select(t.projection_tracking.c.notification_id).where(
                t.projection_tracking.c.projection_name == (projection_name or self.name),
                t.projection_tracking.c.application_name == application_name,
            )
        ).first()
        return int(row.notification_id) if row else 0

    def apply_batch(
        self,
        conn: sa.Connection,
        application_name: str,
        batch: Sequence[tuple[int, Any]],
        last_position: int,
        vectors: dict[str, bytes] | None = None,
        *,
        projection_name: str | None = None,
        read_after: int | None = None,
    ) -> int:
        """Apply (notification_id, event) pairs and set the position to ``last_position``.

        Must be called inside a transaction. Pairs at or below the stored position
        are skipped (exactly once). ``vectors`` are the memory embeddings from
        ``embed_memories``; computed here when not given. ``projection_name`` names
        the position row (a partition's; default: this projection's). ``read_after``:
        the position the batch was read after (the log from there on); a stored
        position below it (the views were reset since: a rebuild in another process)
        raises PositionMovedError, nothing written, since what lies between is in
        neither the views nor the batch. Returns how many events were applied.
        """
        name = projection_name or self.name
        # Write to the position row first: that takes the write lock (SQLite) or the row
        # lock (PostgreSQL), so a concurrent runner waits here and then sees our position.
        conn.execute(
            t.projection_tracking.update()
            .where(
                t.projection_tracking.c.projection_name == name,
                t.projection_tracking.c.application_name == application_name,
            )
            .values(notification_id=t.projection_tracking.c.notification_id)
        )
        position = self.position(conn, application_name, name)
        if read_after is not None and position < read_after:
            raise PositionMovedError(name, read_after, last_position)
        fresh = [(nid, ev) for nid, ev in batch if nid > position]
        if vectors is None:
            vectors = self.embed_memories([ev for _, ev in fresh])
        if vectors and self._check_vectors is not None:
            self._check_vectors()
        self._vectors = vectors
        for notification_id, event in fresh:
            handler = self._handlers.get(type(event))
            if handler is not None:
                try:
                    handler(conn, notification_id, event)
                except SubjectErasedError:
                    # The subject was erased after this event was read: its tombstone,
                    # later in the log, purges whatever the subject still has here.
                    continue
            self._touch_subject(notification_id, event)
        self._flush_subjects(conn)
        if last_position > position:
            self._set_position(conn, application_name, position, last_position, name)
        self._vectors = {}
        self._batch_captures = {}
        return len(fresh)

    def _set_position(
        self, conn: sa.Connection, application_name: str, old: int, new: int, name: str
    ) -> None:
        tracking = t.projection_tracking
        if (
            old == 0
            and not conn.execute(
                sa.select(tracking.c.notification_id).where(
                    tracking.c.projection_name == name,
                    tracking.c.application_name == application_name,
                )
            ).first()
        ):
            conn.execute(
                tracking.insert(),
                dict(
                    projection_name=name,
                    application_name=application_name,
                    notification_id=new,
                ),
            )
            return
        # Guarded update: a concurrent runner that already moved past ``old`` makes this
        # match no row, and the whole batch rolls back instead of applying twice.
        result = conn.execute(
            tracking.update()
            .where(
                tracking.c.projection_name == name,
                tracking.c.application_name == application_name,
                tracking.c.notification_id == old,
            )
            .values(notification_id=new)
        )
        if result.rowcount != 1:
            raise PositionMovedError(name, old, new)

    def embed_memories(self, events: Sequence[Any]) -> dict[str, bytes]:
        """Embed the memory texts among ``events`` in one model call."""
        return embed_memories(self._embedder, events)

    def _touch_subject(self, notification_id: int, event: Any) -> None:
        # By topic, so that an event shredded since it was first projected moves the
        # counters exactly as it did then: a rebuild must equal the live views.
        topic = event.topic if isinstance(event, P.ContentShredded) else get_topic(type(event))
        row = self._touched.setdefault(str(event.originator_id), {"captures": 0})
        row["last_notification_id"] = notification_id
        if topic == CAPTURED:
            row["last_capture_notification_id"] = notification_id
            row["captures"] += 1
        elif topic == CAPTURE_ERASED:
            row["captures"] -= 1
        if topic in MEMORY_TOPICS:
            row["memory_notification_id"] = notification_id

    def _flush_subjects(self, conn: sa.Connection) -> None:
        """Write each touched subject's bookkeeping once per batch."""
        for stream_id, row in self._touched.items():
            values: dict[str, Any] = {k: v for k, v in row.items() if k != "captures"}
            if row["captures"]:
                values["capture_count"] = t.subjects.c.capture_count + row["captures"]
            conn.execute(
                t.subjects.update().where(t.subjects.c.stream_id == stream_id).values(**values)
            )
        self._touched = {}

    def _seal(self, e: Any, table: str, column: str, row_id: str, data: str | bytes) -> bytes:
        raw = data.encode("utf-8") if isinstance(data, str) else data
        return self._sealer.seal(str(e.originator_id), context(table, column, row_id), raw)

    def _open(self, stream_id: str, table: str, column: str, row_id: str, data: bytes) -> str:
        plain = self._sealer.open(stream_id, context(table, column, row_id), data)
        return "" if plain is None else plain.decode("utf-8")

    # ------------------------------------------------------------------ events

    def _registered(self, conn: sa.Connection, nid: int, e: Any) -> None:
        conn.execute(
            t.subjects.insert(),
            dict(
                stream_id=str(e.originator_id),
                tenant=e.tenant,
                capture_count=0,
                last_notification_id=nid,
                last_capture_notification_id=0,
                memory_notification_id=0,
                registered_at=e.timestamp,
            ),
        )

    def _captured(self, conn: sa.Connection, nid: int, e: Any) -> None:
        stream_id = str(e.originator_id)
        session_key = self._sealer.lookup(stream_id, "session", e.session_id)
        conn.execute(
            t.captures.insert(),
            dict(
                capture_id=e.capture_id,
                stream_id=stream_id,
                notification_id=nid,
                app_id=e.app_id,
                agent_id=e.agent_id,
                agent_type=e.agent_type,
                session_id=self._seal(e, "captures", "session_id", e.capture_id, e.session_id),
                session_key=session_key,
                actor=self._seal(e, "captures", "actor", e.capture_id, e.actor),
                purpose=e.purpose,
                sharing=e.sharing,
                source_ref=self._seal(e, "captures", "source_ref", e.capture_id, e.source_ref),
                source_ref_key=self._sealer.lookup(
                    stream_id, "captures.source_ref", source_ref_scope(e.app_id, e.source_ref)
                ),
                user_input=self._seal(e, "captures", "user_input", e.capture_id, e.user_input),
                agent_response=self._seal(
                    e, "captures", "agent_response", e.capture_id, e.agent_response
                ),
                occurred_at=e.occurred_at,
                recorded_at=e.timestamp,
            ),
        )
        self._batch_captures[e.capture_id] = (e.session_id, session_key, e.actor)
        if session_key:
            self._count_session(conn, stream_id, session_key, e.occurred_at)

    def _count_session(
        self, conn: sa.Connection, stream_id: str, session_key: str, at: datetime
    ) -> None:
        sa_t = t.session_activity
        updated = conn.execute(
            sa_t.update()
            .where(sa_t.c.stream_id == stream_id, sa_t.c.session_key == session_key)
            .values(captures=sa_t.c.captures + 1, last_at=at)
        )
        if updated.rowcount == 0:
            conn.execute(
                sa_t.insert(),
                dict(stream_id=stream_id, session_key=session_key, captures=1, last_at=at),
            )

    def _uncount_session(self, conn: sa.Connection, stream_id: str, session_key: str) -> None:
        sa_t = t.session_activity
        where = (sa_t.c.stream_id == stream_id, sa_t.c.session_key == session_key)
        conn.execute(sa_t.update().where(*where).values(captures=sa_t.c.captures - 1))
        # A session with no captures left has no row, exactly as if it never had one.
        conn.execute(sa_t.delete().where(*where, sa_t.c.captures <= 0))

    def _consent_granted(self, conn: sa.Connection, nid: int, e: Any) -> None:
        conn.execute(
            t.consents.insert(),
            dict(
                consent_id=e.consent_id,
                stream_id=str(e.originator_id),
                app_id=e.app_id,
                categories=_json(e.categories),
                purposes=_json(e.purposes),
                legal_basis=e.legal_basis,
                granted_at=e.granted_at,
                expires_at=e.expires_at,
                withdrawn_at=None,
                erase_requested=False,
                granted_position=nid,
                withdrawn_position=None,
            ),
        )

    def _consent_withdrawn(self, conn: sa.Connection, nid: int, e: Any) -> None:
        conn.execute(
            t.consents.update()
            .where(t.consents.c.consent_id == e.consent_id)
            .values(
                withdrawn_at=e.withdrawn_at,
                erase_requested=e.erase_requested,
                withdrawn_position=nid,
            )
        )

    def _attribute_recorded(self, conn: sa.Connection, nid: int, e: Any) -> None:
        self._insert_attribute(conn, e, first_observed_at=e.observed_at)

    def _insert_attribute(
        self, conn: sa.Connection, e: Any, *, first_observed_at: datetime
    ) -> None:
        """One attribute row from a Recorded or Restated event (same fields)."""
        conn.execute(
            t.attributes.insert(),
            dict(
                item_id=e.item_id,
                stream_id=str(e.originator_id),
                key=e.key,
                category=e.category,
                value=self._seal(e, "attributes", "value", e.item_id, e.value),
                confidence=e.confidence,
                provenance=e.provenance,
                status=e.status,
                conflicts_with="[]",
                superseded_by="",
                owner_agent=e.owner_agent,
                sharing=e.sharing,
                author=e.author,
                evidence=_json(e.evidence),
                first_observed_at=first_observed_at,
                last_observed_at=e.observed_at,
                recorded_at=e.timestamp,
            ),
        )

    def _attribute_reinforced(self, conn: sa.Connection, nid: int, e: Any) -> None:
        row = conn.execute(
            sa.select(t.attributes.c.evidence, t.attributes.c.last_observed_at).where(
                t.attributes.c.item_id == e.item_id
            )
        ).first()
        if row is None:  # recorded under a capture that has since been erased
            return
        conn.execute(
            t.attributes.update()
            .where(t.attributes.c.item_id == e.item_id)
            .values(
                confidence=e.confidence,
                provenance=e.provenance,
                evidence=_merge_json(row.evidence, e.evidence),
                last_observed_at=max(_aware(row.last_observed_at), e.observed_at),
            )
        )

    def _attribute_conflict(self, conn: sa.Connection, nid: int, e: Any) -> None:
        ids = [e.item_id, *e.conflicts_with]
        rows = conn.execute(
            sa.select(t.attributes.c.item_id, t.attributes.c.conflicts_with).where(
                t.attributes.c.item_id.in_(ids)
            )
        ).all()
        for row in rows:
            others = [i for i in ids if i != row.item_id]
            conn.execute(
                t.attributes.update()
                .where(t.attributes.c.item_id == row.item_id)
                .values(
                    status="conflicting", conflicts_with=_merge_json(row.conflicts_with, others)
                )
            )

    def _attribute_superseded(self, conn: sa.Connection, nid: int, e: Any) -> None:
        conn.execute(
            t.attributes.update()
            .where(t.attributes.c.item_id == e.item_id)
            .values(status="superseded", superseded_by=e.superseded_by)
        )
        if e.superseded_by:
            conn.execute(
                t.attributes.update()
                .where(t.attributes.c.item_id == e.superseded_by)
                .values(status="current")
            )

    def _memory_row(self, conn: sa.Connection, e: Any) -> dict[str, Any]:
        session_id, session_key, actor = "", "", ""
        stream_id = str(e.originator_id)
        if e.evidence and e.evidence[0] in self._batch_captures:
            session_id, session_key, actor = self._batch_captures[e.evidence[0]]
        elif e.evidence:
            c = t.captures.c
            origin = conn.execute(
                sa.select(c.session_id, c.session_key, c.actor).where(
                    t.captures.c.capture_id == e.evidence[0],
                    t.captures.c.stream_id == stream_id,
                )
            ).first()
            if origin is not None:
                session_key = origin.session_key
                session_id = self._open(
                    stream_id, "captures", "session_id", e.evidence[0], origin.session_id
                )
                actor = self._open(stream_id, "captures", "actor", e.evidence[0], origin.actor)
        vector = self._vectors.get(e.item_id)
        return {
            "item_id": e.item_id,
            "stream_id": str(e.originator_id),
            "category": "experience",
            "provenance": e.provenance,
            "evidence": _json(e.evidence),
            "source_refs": self._seal(e, "memories", "source_refs", e.item_id, "[]"),
            "owner_agent": e.owner_agent,
            "sharing": e.sharing,
            "author": e.author,
            "actor": self._seal(e, "memories", "actor", e.item_id, actor),
            "session_id": self._seal(e, "memories", "session_id", e.item_id, session_id),
            "session_key": session_key,
            "recorded_at": e.timestamp,
            "visits": 0,
            "last_visited_at": None,
            "archived": False,
            "embedding": (
                None
                if vector is None
                else self._seal(e, "memories", "embedding", e.item_id, vector)
            ),
            "detail": self._seal(e, "memories", "detail", e.item_id, "{}"),
        }

    def _memory_recorded(self, conn: sa.Connection, nid: int, e: Any) -> None:
        row = self._memory_row(conn, e)
        row.update(
            kind="memory",
            text=self._seal(e, "memories", "text", e.item_id, e.text),
            category=e.category,
            # The event's categories plus what the detector finds now: version-1 events
            # (no categories of their own) get detection too, and a rebuild applies the
            # current detector to every memory (decision 0016).
            categories=_json(memory_categories(e.category, revealed=e.categories, texts=[e.text])),
            importance=e.importance,
            source_refs=self._seal(e, "memories", "source_refs", e.item_id, _json(e.source_refs)),
            occurred_at=e.occurred_at,
        )
        if e.span:  # where in its capture the memory's text sits (decision 0020)
            span = json.dumps({"span": f"{e.span[0]}-{e.span[1]}"})
            row["detail"] = self._seal(e, "memories", "detail", e.item_id, span)
        conn.execute(t.memories.insert(), row)

    def _experience_recorded(self, conn: sa.Connection, nid: int, e: Any) -> None:
        row = self._memory_row(conn, e)
        detail = {
            "situation": e.situation,
            "action": e.action,
            "outcome": e.outcome,
            "insight": e.insight,
        }
        row.update(
            kind="experience",
            text=self._seal(e, "memories", "text", e.item_id, _memory_embedding_text(e)),
            categories=_json(
                memory_categories(
                    "experience",
                    revealed=e.categories,
                    texts=[e.situation, e.action, e.outcome, e.insight],
                )
            ),
            importance=e.confidence,
            occurred_at=e.observed_at,
            detail=self._seal(
                e,
                "memories",
                "detail",
                e.item_id,
                json.dumps(detail, separators=(",", ":"), sort_keys=True),
            ),
        )
        conn.execute(t.memories.insert(), row)

    def _memories_archived(self, conn: sa.Connection, nid: int, e: Any) -> None:
        conn.execute(
            t.memories.update().where(t.memories.c.item_id.in_(e.item_ids)).values(archived=True)
        )

    def _intent_recorded(self, conn: sa.Connection, nid: int, e: Any) -> None:
        conn.execute(
            t.intents.insert(),
            dict(
                item_id=e.item_id,
                stream_id=str(e.originator_id),
                description=self._seal(e, "intents", "description", e.item_id, e.description),
                category=e.category,
                confidence=e.confidence,
                provenance=e.provenance,
                status="active",
                evidence=_json(e.evidence),
                owner_agent=e.owner_agent,
                sharing=e.sharing,
                author=e.author,
                expires_at=e.expires_at,
                observed_at=e.observed_at,
                status_changed_at=None,
            ),
        )

    def _intent_reinforced(self, conn: sa.Connection, nid: int, e: Any) -> None:
        row = conn.execute(
            sa.select(t.intents.c.evidence).where(t.intents.c.item_id == e.item_id)
        ).first()
        if row is None:
            return
        conn.execute(
            t.intents.update()
            .where(t.intents.c.item_id == e.item_id)
            .values(
                confidence=e.confidence,
                expires_at=e.expires_at,
                evidence=_merge_json(row.evidence, e.evidence),
            )
        )

    def _intent_status_changed(self, conn: sa.Connection, nid: int, e: Any) -> None:
        row = conn.execute(
            sa.select(t.intents.c.evidence).where(t.intents.c.item_id == e.item_id)
        ).first()
        if row is None:
            return
        conn.execute(
            t.intents.update()
            .where(t.intents.c.item_id == e.item_id)
            .values(
                status=e.status,
                status_changed_at=e.observed_at,
                evidence=_merge_json(row.evidence, e.evidence),
            )
        )

    def _slice_served(self, conn: sa.Connection, nid: int, e: Any) -> None:
        stream_id = str(e.originator_id)
        ids = sorted(set(e.item_ids))
        if not ids:
            return
        # Find the rows by primary key. The subject check is wrapped in an expression
        # so that no planner can pick the subject's index instead: without statistics
        # SQLite does, and then scans every memory of the subject (ms per read).
        conn.execute(
            t.memories.update()
            .where(
                t.memories.c.item_id.in_(ids),
                sa.func.coalesce(t.memories.c.stream_id, "") == stream_id,
            )
            .values(visits=t.memories.c.visits + 1, last_visited_at=e.served_at)
        )
        # Three statements per slice however many items it served (reads are frequent).
        reads = t.item_reads
        scope = (
            reads.c.stream_id == stream_id,
            reads.c.app_id == e.app_id,
            reads.c.purpose == e.purpose,
        )
        known = set(
            conn.execute(sa.select(reads.c.item_id).where(*scope, reads.c.item_id.in_(ids)))
            .scalars()
            .all()
        )
        if known:
            conn.execute(
                reads.update()
                .where(*scope, reads.c.item_id.in_(sorted(known)))
                .values(reads=reads.c.reads + 1, last_read_at=e.served_at)
            )
        fresh = [i for i in ids if i not in known]
        if fresh:
            conn.execute(
                reads.insert(),
                [
                    dict(
                        stream_id=stream_id,
                        item_id=item_id,
                        app_id=e.app_id,
                        purpose=e.purpose,
                        reads=1,
                        last_read_at=e.served_at,
                    )
                    for item_id in fresh
                ],
            )

    # ----------------------------------------------------------------- erasure

    def _attribute_restated(self, conn: sa.Connection, nid: int, e: Any) -> None:
        conn.execute(t.attributes.delete().where(t.attributes.c.item_id == e.item_id))
        self._insert_attribute(conn, e, first_observed_at=e.first_observed_at)

    def _items_erased(self, conn: sa.Connection, nid: int, e: Any) -> None:
        ids = list(e.item_ids)
        stream_id = str(e.originator_id)
        for table in (t.attributes, t.memories, t.intents):
            conn.execute(
                table.delete().where(table.c.stream_id == stream_id, table.c.item_id.in_(ids))
            )
        conn.execute(
            t.item_reads.delete().where(
                t.item_reads.c.stream_id == stream_id, t.item_reads.c.item_id.in_(ids)
            )
        )

    def _capture_erased(self, conn: sa.Connection, nid: int, e: Any) -> None:
        stream_id = str(e.originator_id)
        origin = conn.execute(
            sa.select(t.captures.c.session_key).where(t.captures.c.capture_id == e.capture_id)
        ).first()
        if origin is not None and origin.session_key:
            self._uncount_session(conn, stream_id, origin.session_key)
        conn.execute(
            t.captures.delete().where(
                t.captures.c.stream_id == str(e.originator_id),
                t.captures.c.capture_id == e.capture_id,
            )
        )

    def _subject_erased(self, conn: sa.Connection, nid: int, e: Any) -> None:
        """Purge every row of the subject in every view (the erasure cascade, step 4)."""
        stream_id = str(e.originator_id)
        for table in t.SUBJECT_TABLES:
            conn.execute(table.delete().where(table.c.stream_id == stream_id))


def embed_memories(embedder: TextEmbedder | None, events: Sequence[Any]) -> dict[str, bytes]:
    """The vectors of the memory texts among ``events`` (float32 bytes by item id), from
    one model call; {} without an embedder. No database: ``ProjectionRunner`` runs it in
    its embedding thread, outside the view store's transaction."""
    if embedder is None:
        return {}
    pending = [
        (e.item_id, _memory_embedding_text(e))
        for e in events
        if isinstance(e, P.MemoryRecorded | P.ExperienceRecorded)
    ]
    if not pending:
        return {}
    matrix = embedder.embed([text for _, text in pending]).astype(np.float32)
    return {item_id: matrix[i].tobytes() for i, (item_id, _) in enumerate(pending)}


def _memory_embedding_text(e: Any) -> str:
    if isinstance(e, P.ExperienceRecorded):
        parts = [
            f"Situation: {e.situation}",
            f"Action: {e.action}",
            f"Outcome: {e.outcome}" if e.outcome else "",
            f"Insight: {e.insight}" if e.insight else "",
        ]
        return " ".join(p for p in parts if p)
    return str(e.text)


def _aware(value: datetime) -> datetime:
    """SQLite returns naive datetimes; every stored time is UTC."""
    return value if value.tzinfo else value.replace(tzinfo=UTC)
