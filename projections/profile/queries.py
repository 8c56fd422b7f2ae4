"""Read queries over the profile read model; they return frozen rows, never ORM objects."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import sqlalchemy as sa

from domain.errors import SubjectErasedError
from projections.profile import tables as t
from projections.profile.sealing import FieldSealer, context, source_ref_scope


def aware(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every stored time is UTC."""
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


@dataclass(frozen=True)
class AttributeRow:
    item_id: str
    key: str
    category: str
    value: str
    confidence: float
    provenance: str
    status: str
    conflicts_with: tuple[str, ...]
    superseded_by: str
    owner_agent: str
    sharing: str
    author: str
    evidence: tuple[str, ...]
    first_observed_at: datetime
    last_observed_at: datetime


@dataclass(frozen=True)
class MemoryRow:
    item_id: str
    kind: str
    text: str
    category: str
    importance: float
    provenance: str
    evidence: tuple[str, ...]
    source_refs: tuple[str, ...]
    owner_agent: str
    sharing: str
    author: str
    actor: str
    session_id: str
    #: Keyed hash of the session the memory came from ("" if none): matches
    #: the keys of ``session_activity``.
    session_key: str
    occurred_at: datetime
    recorded_at: datetime
    visits: int
    last_visited_at: datetime | None
    archived: bool
    detail: dict[str, str]
    #: Every category the memory reveals, primary first; "*" stands for all of them.
    categories: tuple[str, ...] = ()


@dataclass(frozen=True)
class IntentRow:
    item_id: str
    description: str
    category: str
    confidence: float
    provenance: str
    status: str
    evidence: tuple[str, ...]
    owner_agent: str
    sharing: str
    author: str
    expires_at: datetime | None
    observed_at: datetime
    status_changed_at: datetime | None


@dataclass(frozen=True)
class ConsentRow:
    consent_id: str
    app_id: str
    categories: tuple[str, ...]
    purposes: tuple[str, ...]
    legal_basis: str
    granted_at: datetime
    expires_at: datetime | None
    withdrawn_at: datetime | None
    erase_requested: bool
    #: Log positions of the grant and of the withdrawal (None: not withdrawn, or a row
    #: projected before migration 0005_views_consent_positions).
    granted_position: int | None
    withdrawn_position: int | None


@dataclass(frozen=True)
class CaptureRow:
    capture_id: str
    stream_id: str
    notification_id: int
    app_id: str
    agent_id: str
    session_id: str
    actor: str
    purpose: str
    source_ref: str
    user_input: str
    agent_response: str
    occurred_at: datetime
    #: The capture's sharing policy: which agents may see it, and so cite it as evidence.
    sharing: str = "private"


def _tuple(raw: str) -> tuple[str, ...]:
    return tuple(json.loads(raw))


def _after(
    first: sa.ColumnElement[Any], second: sa.ColumnElement[Any], key: tuple[datetime, str]
) -> sa.ColumnElement[bool]:
    """``(first, second) > key``, spelt out (row values differ between the dialects)."""
    when, tie = key
    return sa.or_(first > when, sa.and_(first == when, second > tie))


def _consent_row(r: Any) -> ConsentRow:
    return ConsentRow(
        consent_id=r.consent_id,
        app_id=r.app_id,
        categories=_tuple(r.categories),
        purposes=_tuple(r.purposes),
        legal_basis=r.legal_basis,
        granted_at=aware(r.granted_at),  # type: ignore[arg-type]
        expires_at=aware(r.expires_at),
        withdrawn_at=aware(r.withdrawn_at),
        erase_requested=r.erase_requested,
        granted_position=r.granted_position,
        withdrawn_position=r.withdrawn_position,
    )


class ProfileQueries:
    """Queries scoped to one subject stream at a time (I5: no cross-subject reads)."""

    def __init__(self, engine: sa.Engine, sealer: FieldSealer) -> None:
        self._engine = engine
        self._sealer = sealer

    def _text(self, stream_id: str, table: str, column: str, row_id: str, data: bytes) -> str:
        raw = self._sealer.open(stream_id, context(table, column, row_id), data)
        return "" if raw is None else raw.decode("utf-8")

    def _bytes(self, stream_id: str, table: str, column: str, row_id: str, data: bytes) -> bytes:
        return self._sealer.open(stream_id, context(table, column, row_id), data) or b""

    def attributes(self, stream_id: str, *, include_superseded: bool = True) -> list[AttributeRow]:
        q = sa.select(t.attributes).where(t.attributes.c.stream_id == stream_id)
        if not include_superseded:
            q = q.where(t.attributes.c.status != "superseded")
        with self._engine.connect() as conn:
            rows = conn.execute(q.order_by(t.attributes.c.category, t.attributes.c.key)).all()
        return [
            AttributeRow(
                item_id=r.item_id,
                key=r.key,
                category=r.category,
                value=self._text(stream_id, "attributes", "value", r.item_id, r.value),
                confidence=r.confidence,
                provenance=r.provenance,
                status=r.status,
                conflicts_with=_tuple(r.conflicts_with),
                superseded_by=r.superseded_by,
                owner_agent=r.owner_agent,
                sharing=r.sharing,
                author=r.author,
                evidence=_tuple(r.evidence),
                first_observed_at=aware(r.first_observed_at),  # type: ignore[arg-type]
                last_observed_at=aware(r.last_observed_at),  # type: ignore[arg-type]
            )
            for r in rows
        ]

    def memories(
        self, stream_id: str, *, include_archived: bool = False, with_vectors: bool = False
    ) -> tuple[list[MemoryRow], np.ndarray | None]:
        """Return memories (oldest first) and, if asked, their stacked embedding matrix."""
        q = sa.select(t.memories).where(t.memories.c.stream_id == stream_id)
        if not include_archived:
            q = q.where(t.memories.c.archived.is_(False))
        with self._engine.connect() as conn:
            rows = conn.execute(q.order_by(t.memories.c.occurred_at, t.memories.c.item_id)).all()
        memories = [self._memory_row(stream_id, r) for r in rows]
        if not with_vectors:
            return memories, None
        if not rows or any(r.embedding is None for r in rows):
            return memories, None
        vectors = [
            self._bytes(stream_id, "memories", "embedding", r.item_id, r.embedding) for r in rows
        ]
        if any(not v for v in vectors):
            return memories, None
        matrix = np.frombuffer(b"".join(vectors), dtype=np.float32)
        return memories, matrix.reshape(len(rows), -1)

    def _memory_row(self, stream_id: str, r: Any) -> MemoryRow:
        return MemoryRow(
            item_id=r.item_id,
            kind=r.kind,
            text=self._text(stream_id, "memories", "text", r.item_id, r.text),
            category=r.category,
            importance=r.importance,
            provenance=r.provenance,
            evidence=_tuple(r.evidence),
            source_refs=_tuple(
                self._text(stream_id, "memories", "source_refs", r.item_id, r.source_refs) or "[]"
            ),
            owner_agent=r.owner_agent,
            sharing=r.sharing,
            author=r.author,
            actor=self._text(stream_id, "memories", "actor", r.item_id, r.actor),
            session_id=self._text(stream_id, "memories", "session_id", r.item_id, r.session_id),
            session_key=r.session_key,
            occurred_at=aware(r.occurred_at),  # type: ignore[arg-type]
            recorded_at=aware(r.recorded_at),  # type: ignore[arg-type]
            visits=r.visits,
            last_visited_at=aware(r.last_visited_at),
            archived=r.archived,
            detail=json.loads(
                self._text(stream_id, "memories", "detail", r.item_id, r.detail) or "{}"
            ),
            categories=_tuple(r.categories),
        )

    def intents(self, stream_id: str, *, status: str | None = None) -> list[IntentRow]:
        q = sa.select(t.intents).where(t.intents.c.stream_id == stream_id)
        if status is not None:
            q = q.where(t.intents.c.status == status)
        with self._engine.connect() as conn:
            rows = conn.execute(q.order_by(t.intents.c.observed_at, t.intents.c.item_id)).all()
        return [
            IntentRow(
                item_id=r.item_id,
                description=self._text(
                    stream_id, "intents", "description", r.item_id, r.description
                ),
                category=r.category,
                confidence=r.confidence,
                provenance=r.provenance,
                status=r.status,
                evidence=_tuple(r.evidence),
                owner_agent=r.owner_agent,
                sharing=r.sharing,
                author=r.author,
                expires_at=aware(r.expires_at),
                observed_at=aware(r.observed_at),  # type: ignore[arg-type]
                status_changed_at=aware(r.status_changed_at),
            )
            for r in rows
        ]

    def consents(self, stream_id: str) -> list[ConsentRow]:
        q = sa.select(t.consents).where(t.consents.c.stream_id == stream_id)
        with self._engine.connect() as conn:
            rows = conn.execute(q.order_by(t.consents.c.granted_at)).all()
        return [_consent_row(r) for r in rows]

    def consents_after(
        self,
        stream_id: str,
        *,
        app_id: str | None,
        after: tuple[datetime, str] | None,
        limit: int,
    ) -> list[ConsentRow]:
        """Up to ``limit`` consents after the keyset position (granted_at, consent_id).

        Both key columns never change once a consent is recorded, so a walk over
        pages sees every consent that existed throughout it exactly once.
        """
        c = t.consents.c
        q = sa.select(t.consents).where(c.stream_id == stream_id)
        if app_id is not None:
            q = q.where(c.app_id == app_id)
        if after is not None:
            q = q.where(_after(c.granted_at, c.consent_id, after))
        q = q.order_by(c.granted_at, c.consent_id).limit(limit)
        with self._engine.connect() as conn:
            return [_consent_row(r) for r in conn.execute(q).all()]

    def memories_after(
        self, stream_id: str, *, after: tuple[datetime, str] | None, limit: int
    ) -> list[MemoryRow]:
        """Up to ``limit`` memories (archived ones too) after (occurred_at, item_id)."""
        c = t.memories.c
        q = sa.select(t.memories).where(c.stream_id == stream_id)
        if after is not None:
            q = q.where(_after(c.occurred_at, c.item_id, after))
        q = q.order_by(c.occurred_at, c.item_id).limit(limit)
        with self._engine.connect() as conn:
            rows = conn.execute(q).all()
        return [self._memory_row(stream_id, r) for r in rows]

    def captures(self, capture_ids: Iterable[str]) -> dict[str, CaptureRow]:
        """Look up captures by id across subjects (callers check the stream)."""
        ids = sorted(set(capture_ids))
        if not ids:
            return {}
        with self._engine.connect() as conn:
            rows = conn.execute(sa.select(t.captures).where(t.captures.c.capture_id.in_(ids))).all()
        return {r.capture_id: self._capture_row(r) for r in rows}

    def all_captures(self, stream_id: str) -> list[CaptureRow]:
        """Every capture of one subject, oldest first."""
        with self._engine.connect() as conn:
            rows = conn.execute(
                sa.select(t.captures)
                .where(t.captures.c.stream_id == stream_id)
                .order_by(t.captures.c.notification_id)
            ).all()
        return [self._capture_row(r) for r in rows]

    def _capture_row(self, r: Any) -> CaptureRow:
        return CaptureRow(
            capture_id=r.capture_id,
            stream_id=r.stream_id,
            notification_id=r.notification_id,
            app_id=r.app_id,
            agent_id=r.agent_id,
            session_id=self._text(
                r.stream_id, "captures", "session_id", r.capture_id, r.session_id
            ),
            actor=self._text(r.stream_id, "captures", "actor", r.capture_id, r.actor),
            purpose=r.purpose,
            source_ref=self._text(
                r.stream_id, "captures", "source_ref", r.capture_id, r.source_ref
            ),
            user_input=self._text(
                r.stream_id, "captures", "user_input", r.capture_id, r.user_input
            ),
            agent_response=self._text(
                r.stream_id, "captures", "agent_response", r.capture_id, r.agent_response
            ),
            occurred_at=aware(r.occurred_at),  # type: ignore[arg-type]
            sharing=r.sharing,
        )

    def captures_by(
        self,
        stream_id: str,
        *,
        app_id: str,
        purposes: Sequence[str],
        after_position: int | None = None,
        before_position: int | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[str]:
        """Ids of a subject's captures from one app for some purposes, within bounds.

        Log positions bound them exclusively (``after_position`` < notification_id <
        ``before_position``), times inclusively (``since`` <= recorded_at <= ``until``);
        every bound given applies.
        """
        c = t.captures.c
        q = sa.select(c.capture_id).where(c.stream_id == stream_id, c.app_id == app_id)
        if after_position is not None:
            q = q.where(c.notification_id > after_position)
        if before_position is not None:
            q = q.where(c.notification_id < before_position)
        if since is not None:
            q = q.where(c.recorded_at >= since)
        if until is not None:
            q = q.where(c.recorded_at <= until)
        if "*" not in purposes:
            q = q.where(c.purpose.in_(list(purposes)))
        with self._engine.connect() as conn:
            return list(conn.execute(q).scalars())

    def session_activity(self, stream_id: str) -> dict[str, int]:
        """Captures per session, keyed by the session's keyed hash (``session_key``)."""
        sa_t = t.session_activity
        with self._engine.connect() as conn:
            rows = conn.execute(
                sa.select(sa_t.c.session_key, sa_t.c.captures).where(sa_t.c.stream_id == stream_id)
            ).all()
        return {r.session_key: r.captures for r in rows}

    def captured_source_refs(
        self, stream_id: str, app_id: str, source_refs: Sequence[str]
    ) -> set[str]:
        """Which of these source refs of one app the subject already has captures for.

        Matched by keyed hash (the refs are not stored in plaintext); refs of an
        erased subject match nothing.
        """
        wanted = {r for r in source_refs if r}
        if not wanted:
            return set()
        try:
            by_key = {
                self._sealer.lookup(
                    stream_id, "captures.source_ref", source_ref_scope(app_id, r)
                ): r
                for r in wanted
            }
        except SubjectErasedError:
            return set()
        c = t.captures.c
        found: set[str] = set()
        keys = sorted(by_key)
        with self._engine.connect() as conn:
            for start in range(0, len(keys), 500):
                rows = conn.execute(
                    sa.select(c.source_ref_key).where(
                        c.stream_id == stream_id,
                        c.app_id == app_id,
                        c.source_ref_key.in_(keys[start : start + 500]),
                    )
                ).scalars()
                found.update(by_key[k] for k in rows)
        return found

    def item_reads(self, stream_id: str) -> list[tuple[str, str, str, int, datetime]]:
        r_t = t.item_reads
        with self._engine.connect() as conn:
            rows = conn.execute(
                sa.select(r_t).where(r_t.c.stream_id == stream_id).order_by(r_t.c.last_read_at)
            ).all()
        return [
            (r.item_id, r.app_id, r.purpose, r.reads, aware(r.last_read_at))  # type: ignore[misc]
            for r in rows
        ]

    def position(self, projection_name: str, application_name: str) -> int:
        tr = t.projection_tracking
        with self._engine.connect() as conn:
            row = conn.execute(
                sa.select(tr.c.notification_id).where(
                    tr.c.projection_name == projection_name,
                    tr.c.application_name == application_name,
                )
            ).first()
        return int(row[0]) if row else 0

    def table_digest(
        self, stream_ids: Sequence[str] | None = None
    ) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every view, sorted: for rebuild-equals-live checks.

        Embeddings are left out: a batched model run may differ in the last float
        bits from an unbatched one; ``embedding_matrix`` compares them with a tolerance.
        """
        digest: dict[str, list[tuple[Any, ...]]] = {}
        with self._engine.connect() as conn:
            for table in t.SUBJECT_TABLES:
                cols = [c for c in table.c if c.name != "embedding"]
                q = sa.select(*cols)
                if stream_ids is not None:
                    q = q.where(table.c.stream_id.in_(list(stream_ids)))
                rows = [tuple(r) for r in conn.execute(q)]
                digest[table.name] = sorted(rows, key=repr)
        return digest

    def embedding_matrix(self) -> tuple[list[str], np.ndarray]:
        """All memory ids (sorted) and their vectors, for rebuild comparisons."""
        with self._engine.connect() as conn:
            rows = conn.execute(
                sa.select(t.memories.c.item_id, t.memories.c.stream_id, t.memories.c.embedding)
                .where(t.memories.c.embedding.is_not(None))
                .order_by(t.memories.c.item_id)
            ).all()
        if not rows:
            return [], np.zeros((0, 0), dtype=np.float32)
        vectors = [
            self._bytes(r.stream_id, "memories", "embedding", r.item_id, r.embedding) for r in rows
        ]
        matrix = np.frombuffer(b"".join(vectors), dtype=np.float32)
        return [r.item_id for r in rows], matrix.reshape(len(rows), -1)
