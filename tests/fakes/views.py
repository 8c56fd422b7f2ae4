"""InMemoryViewStore: the ViewStore port over dictionaries.

A second projector, written handler by handler from ``ProfileProjector``: the same
events change the same rows, and the queries return the same frozen rows as
``ProfileQueries``. It keeps plaintext (a process-local fake needs no at-rest
sealing) but behaves as sealing does: a subject whose view key is gone gets no new
sealed rows, and its personal fields read back empty. Keyed hashes (session keys,
source-ref lookups) come from the production ``ViewSealer`` over the same key store,
so they equal the SQL adapter's. ``tests/contracts/test_view_store.py`` projects the
same histories through both and compares every query.

Not covered (the port does not expose it): the ``subjects`` bookkeeping table.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from domain.categories import memory_categories
from domain.errors import PositionMovedError, SubjectErasedError
from domain.profile import SubjectProfile as P
from projections.profile.projector import (
    PROJECTION_NAME,
    _memory_embedding_text,
    embed_memories,
)
from projections.profile.queries import (
    AttributeRow,
    CaptureRow,
    ConsentRow,
    IntentRow,
    MemoryRow,
)
from projections.profile.sealing import source_ref_scope
from uprof.crypto.fields import ViewSealer
from uprof.ports import Embedder, SubjectKeyStore


def _merge(existing: Sequence[str], extra: Sequence[str]) -> tuple[str, ...]:
    merged = list(existing)
    merged.extend(e for e in extra if e not in merged)
    return tuple(merged)


@dataclass
class _Tables:
    """Rows by primary key, as plain dicts of column values (plaintext)."""

    captures: dict[str, dict[str, Any]] = field(default_factory=dict)
    sessions: dict[tuple[str, str], int] = field(default_factory=dict)
    consents: dict[str, dict[str, Any]] = field(default_factory=dict)
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)
    memories: dict[str, dict[str, Any]] = field(default_factory=dict)
    intents: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: (stream, app, purpose, item) -> [reads, last_read_at]
    reads: dict[tuple[str, str, str, str], list[Any]] = field(default_factory=dict)
    positions: dict[tuple[str, str], int] = field(default_factory=dict)


class InMemoryViewStore:
    """Profile read models in dictionaries; nothing outlives the object."""

    def __init__(self, keys: SubjectKeyStore, embedder: Embedder | None = None) -> None:
        self._keys = keys
        self._sealer = ViewSealer(keys)  # type: ignore[arg-type]
        self._embedder = embedder
        self._lock = threading.Lock()
        self._t = _Tables()
        self._vectors: dict[str, bytes] = {}
        self._batch_captures: dict[str, tuple[str, str, str]] = {}
        self._handlers: dict[type, Callable[[_Tables, int, Any], None]] = {
            P.InteractionCaptured: self._captured,
            P.ConsentGranted: self._consent_granted,
            P.ConsentWithdrawn: self._consent_withdrawn,
            P.AttributeRecorded: self._attribute_recorded,
            P.AttributeReinforced: self._attribute_reinforced,
            P.AttributeConflictFlagged: self._attribute_conflict,
            P.AttributeSuperseded: self._attribute_superseded,
            P.AttributeRestated: self._attribute_restated,
            P.MemoryRecorded: self._memory_recorded,
            P.ExperienceRecorded: self._experience_recorded,
            P.MemoriesArchived: self._memories_archived,
            P.IntentRecorded: self._intent_recorded,
            P.IntentReinforced: self._intent_reinforced,
            P.IntentStatusChanged: self._intent_status_changed,
            P.SliceServed: self._slice_served,
            P.ItemsErased: self._items_erased,
            P.CaptureErased: self._capture_erased,
            P.SubjectErased: self._subject_erased,
        }

    # ----------------------------------------------------------------- batches

    @property
    def name(self) -> str:
        return PROJECTION_NAME

    def position(self, projection_name: str, application_name: str) -> int:
        return self._t.positions.get((projection_name, application_name), 0)

    def ensure_positions(self, projection_names: Sequence[str], application_name: str) -> None:
        with self._lock:
            for name in projection_names:
                self._t.positions.setdefault((name, application_name), 0)

    def lowest_position(self, projection_names: Sequence[str], application_name: str) -> int:
        # Of the positions that exist, as SQL's MIN over the rows there are.
        wanted = {(name, application_name) for name in projection_names}
        return min((n for key, n in self._t.positions.items() if key in wanted), default=0)

    def reset(self, projection_names: Sequence[str]) -> None:
        with self._lock:
            names = set(projection_names)
            # Every subject's rows go, and the positions of every application that claim them.
            positions = {key: 0 if key[0] in names else n for key, n in self._t.positions.items()}
            self._t = _Tables(positions=positions)

    def apply_batch(
        self,
        application_name: str,
        batch: Sequence[tuple[int, Any]],
        last_position: int,
        vectors: dict[str, bytes] | None = None,
        *,
        projection_name: str | None = None,
        read_after: int | None = None,
    ) -> int:
        name = projection_name or PROJECTION_NAME
        with self._lock:
            start = self.position(name, application_name)
            if read_after is not None and start < read_after:
                raise PositionMovedError(name, read_after, last_position)
            fresh = [(nid, ev) for nid, ev in batch if nid > start]
            if vectors is None:
                vectors = self._embed([ev for _, ev in fresh])
            # Work on a copy and swap it in at the end: a failing handler leaves nothing.
            work = copy.deepcopy(self._t)
            self._vectors, self._batch_captures = vectors, {}
            try:
                for nid, event in fresh:
                    handler = self._handlers.get(type(event))
                    if handler is None:
                        continue
                    try:
                        handler(work, nid, event)
                    except SubjectErasedError:
                        continue  # as the projector: the tombstone later purges the rest
            finally:
                self._vectors, self._batch_captures = {}, {}
            if last_position > start:
                if self.position(name, application_name) != start:
                    raise PositionMovedError(name, start, last_position)
                work.positions[(name, application_name)] = last_position
            self._t = work
            return len(fresh)

    def _embed(self, events: Sequence[Any]) -> dict[str, bytes]:
        return embed_memories(self._embedder, events)

    def _require_key(self, stream_id: str) -> None:
        """Where the projector seals a field: no key, no row (SubjectErasedError)."""
        if self._keys.view_key(stream_id) is None:
            raise SubjectErasedError("this subject's keys have been destroyed")

    def _readable(self, stream_id: str) -> bool:
        return self._keys.view_key(stream_id) is not None

    # ------------------------------------------------------------------ events

    def _captured(self, t: _Tables, nid: int, e: Any) -> None:
        stream_id = str(e.originator_id)
        self._require_key(stream_id)
        session_key = self._sealer.lookup(stream_id, "session", e.session_id)
        t.captures[e.capture_id] = dict(
            capture_id=e.capture_id,
            stream_id=stream_id,
            notification_id=nid,
            app_id=e.app_id,
            agent_id=e.agent_id,
            session_id=e.session_id,
            session_key=session_key,
            actor=e.actor,
            purpose=e.purpose,
            source_ref=e.source_ref,
            user_input=e.user_input,
            agent_response=e.agent_response,
            occurred_at=e.occurred_at,
            recorded_at=e.timestamp,
            sharing=e.sharing,
        )
        self._batch_captures[e.capture_id] = (e.session_id, session_key, e.actor)
        if session_key:
            key = (stream_id, session_key)
            t.sessions[key] = t.sessions.get(key, 0) + 1

    def _consent_granted(self, t: _Tables, nid: int, e: Any) -> None:
        t.consents[e.consent_id] = dict(
            consent_id=e.consent_id,
            stream_id=str(e.originator_id),
            app_id=e.app_id,
            categories=tuple(e.categories),
            purposes=tuple(e.purposes),
            legal_basis=e.legal_basis,
            granted_at=e.granted_at,
            expires_at=e.expires_at,
            withdrawn_at=None,
            erase_requested=False,
            granted_position=nid,
            withdrawn_position=None,
        )

    def _consent_withdrawn(self, t: _Tables, nid: int, e: Any) -> None:
        row = t.consents.get(e.consent_id)
        if row is not None:
            row.update(
                withdrawn_at=e.withdrawn_at,
                erase_requested=e.erase_requested,
                withdrawn_position=nid,
            )

    def _insert_attribute(self, t: _Tables, e: Any, first_observed_at: datetime) -> None:
        self._require_key(str(e.originator_id))
        t.attributes[e.item_id] = dict(
            item_id=e.item_id,
            stream_id=str(e.originator_id),
            key=e.key,
            category=e.category,
            value=e.value,
            confidence=e.confidence,
            provenance=e.provenance,
            status=e.status,
            conflicts_with=(),
            superseded_by="",
            owner_agent=e.owner_agent,
            sharing=e.sharing,
            author=e.author,
            evidence=tuple(e.evidence),
            first_observed_at=first_observed_at,
            last_observed_at=e.observed_at,
        )

    def _attribute_recorded(self, t: _Tables, nid: int, e: Any) -> None:
        self._insert_attribute(t, e, e.observed_at)

    def _attribute_restated(self, t: _Tables, nid: int, e: Any) -> None:
        t.attributes.pop(e.item_id, None)
        self._insert_attribute(t, e, e.first_observed_at)

    def _attribute_reinforced(self, t: _Tables, nid: int, e: Any) -> None:
        row = t.attributes.get(e.item_id)
        if row is None:  # recorded under a capture that has since been erased
            return
        row.update(
            confidence=e.confidence,
            provenance=e.provenance,
            evidence=_merge(row["evidence"], e.evidence),
            last_observed_at=max(row["last_observed_at"], e.observed_at),
        )

    def _attribute_conflict(self, t: _Tables, nid: int, e: Any) -> None:
        ids = [e.item_id, *e.conflicts_with]
        for item_id in ids:
            row = t.attributes.get(item_id)
            if row is None:
                continue
            others = [i for i in ids if i != item_id]
            row.update(status="conflicting", conflicts_with=_merge(row["conflicts_with"], others))

    def _attribute_superseded(self, t: _Tables, nid: int, e: Any) -> None:
        if (row := t.attributes.get(e.item_id)) is not None:
            row.update(status="superseded", superseded_by=e.superseded_by)
        if e.superseded_by and (newer := t.attributes.get(e.superseded_by)) is not None:
            newer["status"] = "current"

    def _memory_base(self, t: _Tables, e: Any) -> dict[str, Any]:
        stream_id = str(e.originator_id)
        self._require_key(stream_id)
        session_id, session_key, actor = "", "", ""
        if e.evidence and e.evidence[0] in self._batch_captures:
            session_id, session_key, actor = self._batch_captures[e.evidence[0]]
        elif e.evidence:
            origin = t.captures.get(e.evidence[0])
            if origin is not None and origin["stream_id"] == stream_id:
                session_id, session_key = origin["session_id"], origin["session_key"]
                actor = origin["actor"]
        return dict(
            item_id=e.item_id,
            stream_id=stream_id,
            category="experience",
            provenance=e.provenance,
            evidence=tuple(e.evidence),
            source_refs=(),
            owner_agent=e.owner_agent,
            sharing=e.sharing,
            author=e.author,
            actor=actor,
            session_id=session_id,
            session_key=session_key,
            recorded_at=e.timestamp,
            visits=0,
            last_visited_at=None,
            archived=False,
            embedding=self._vectors.get(e.item_id),
            detail={},
        )

    def _memory_recorded(self, t: _Tables, nid: int, e: Any) -> None:
        row = self._memory_base(t, e)
        row.update(
            kind="memory",
            text=e.text,
            category=e.category,
            categories=tuple(memory_categories(e.category, revealed=e.categories, texts=[e.text])),
            importance=e.importance,
            source_refs=tuple(e.source_refs),
            occurred_at=e.occurred_at,
        )
        if e.span:
            row["detail"] = {"span": f"{e.span[0]}-{e.span[1]}"}
        t.memories[e.item_id] = row

    def _experience_recorded(self, t: _Tables, nid: int, e: Any) -> None:
        row = self._memory_base(t, e)
        row.update(
            kind="experience",
            text=_memory_embedding_text(e),
            categories=tuple(
                memory_categories(
                    "experience",
                    revealed=e.categories,
                    texts=[e.situation, e.action, e.outcome, e.insight],
                )
            ),
            importance=e.confidence,
            occurred_at=e.observed_at,
            detail={
                "action": e.action,
                "insight": e.insight,
                "outcome": e.outcome,
                "situation": e.situation,
            },
        )
        t.memories[e.item_id] = row

    def _memories_archived(self, t: _Tables, nid: int, e: Any) -> None:
        for item_id in e.item_ids:
            if (row := t.memories.get(item_id)) is not None:
                row["archived"] = True

    def _intent_recorded(self, t: _Tables, nid: int, e: Any) -> None:
        self._require_key(str(e.originator_id))
        t.intents[e.item_id] = dict(
            item_id=e.item_id,
            stream_id=str(e.originator_id),
            description=e.description,
            category=e.category,
            confidence=e.confidence,
            provenance=e.provenance,
            status="active",
            evidence=tuple(e.evidence),
            owner_agent=e.owner_agent,
            sharing=e.sharing,
            author=e.author,
            expires_at=e.expires_at,
            observed_at=e.observed_at,
            status_changed_at=None,
        )

    def _intent_reinforced(self, t: _Tables, nid: int, e: Any) -> None:
        if (row := t.intents.get(e.item_id)) is not None:
            row.update(
                confidence=e.confidence,
                expires_at=e.expires_at,
                evidence=_merge(row["evidence"], e.evidence),
            )

    def _intent_status_changed(self, t: _Tables, nid: int, e: Any) -> None:
        if (row := t.intents.get(e.item_id)) is not None:
            row.update(
                status=e.status,
                status_changed_at=e.observed_at,
                evidence=_merge(row["evidence"], e.evidence),
            )

    def _slice_served(self, t: _Tables, nid: int, e: Any) -> None:
        stream_id = str(e.originator_id)
        for item_id in sorted(set(e.item_ids)):
            memory = t.memories.get(item_id)
            if memory is not None and memory["stream_id"] == stream_id:
                memory.update(visits=memory["visits"] + 1, last_visited_at=e.served_at)
            key = (stream_id, e.app_id, e.purpose, item_id)
            reads = t.reads.setdefault(key, [0, e.served_at])
            reads[0] += 1
            reads[1] = e.served_at

    def _items_erased(self, t: _Tables, nid: int, e: Any) -> None:
        stream_id = str(e.originator_id)
        ids = set(e.item_ids)
        for table in (t.attributes, t.memories, t.intents):
            for item_id in ids:
                if item_id in table and table[item_id]["stream_id"] == stream_id:
                    del table[item_id]
        for key in [k for k in t.reads if k[0] == stream_id and k[3] in ids]:
            del t.reads[key]

    def _capture_erased(self, t: _Tables, nid: int, e: Any) -> None:
        stream_id = str(e.originator_id)
        origin = t.captures.get(e.capture_id)
        if origin is not None and origin["session_key"]:
            key = (stream_id, origin["session_key"])
            left = t.sessions.get(key, 0) - 1
            if left <= 0:  # a session with no captures left has no row
                t.sessions.pop(key, None)
            else:
                t.sessions[key] = left
        if origin is not None and origin["stream_id"] == stream_id:
            del t.captures[e.capture_id]

    def _subject_erased(self, t: _Tables, nid: int, e: Any) -> None:
        stream_id = str(e.originator_id)
        for table in (t.captures, t.consents, t.attributes, t.memories, t.intents):
            for row_id in [k for k, row in table.items() if row["stream_id"] == stream_id]:
                del table[row_id]
        for key in [k for k in t.sessions if k[0] == stream_id]:
            del t.sessions[key]
        for rkey in [k for k in t.reads if k[0] == stream_id]:
            del t.reads[rkey]

    # ----------------------------------------------------------------- queries

    def _personal(self, stream_id: str, value: Any, empty: Any) -> Any:
        """A personal field as the SQL adapter returns it: empty once the key is gone."""
        return value if self._readable(stream_id) else empty

    def attributes(self, stream_id: str, *, include_superseded: bool = True) -> list[AttributeRow]:
        rows = [
            r
            for r in self._t.attributes.values()
            if r["stream_id"] == stream_id and (include_superseded or r["status"] != "superseded")
        ]
        rows.sort(key=lambda r: (r["category"], r["key"]))
        return [
            AttributeRow(
                **{k: v for k, v in r.items() if k not in ("stream_id", "value")},
                value=self._personal(stream_id, r["value"], ""),
            )
            for r in rows
        ]

    def _memory_row(self, r: dict[str, Any]) -> MemoryRow:
        sid = r["stream_id"]
        return MemoryRow(
            item_id=r["item_id"],
            kind=r["kind"],
            text=self._personal(sid, r["text"], ""),
            category=r["category"],
            importance=r["importance"],
            provenance=r["provenance"],
            evidence=r["evidence"],
            source_refs=self._personal(sid, r["source_refs"], ()),
            owner_agent=r["owner_agent"],
            sharing=r["sharing"],
            author=r["author"],
            actor=self._personal(sid, r["actor"], ""),
            session_id=self._personal(sid, r["session_id"], ""),
            session_key=r["session_key"],
            occurred_at=r["occurred_at"],
            recorded_at=r["recorded_at"],
            visits=r["visits"],
            last_visited_at=r["last_visited_at"],
            archived=r["archived"],
            detail=dict(self._personal(sid, r["detail"], {})),
            categories=r["categories"],
        )

    def _memories_of(self, stream_id: str) -> list[dict[str, Any]]:
        rows = [r for r in self._t.memories.values() if r["stream_id"] == stream_id]
        return sorted(rows, key=lambda r: (r["occurred_at"], r["item_id"]))

    def memories(
        self, stream_id: str, *, include_archived: bool = False, with_vectors: bool = False
    ) -> tuple[list[MemoryRow], np.ndarray | None]:
        rows = [r for r in self._memories_of(stream_id) if include_archived or not r["archived"]]
        memories = [self._memory_row(r) for r in rows]
        if not with_vectors or not rows or not self._readable(stream_id):
            return memories, None
        if any(r["embedding"] is None for r in rows):
            return memories, None
        matrix = np.frombuffer(b"".join(r["embedding"] for r in rows), dtype=np.float32)
        return memories, matrix.reshape(len(rows), -1)

    def memories_after(
        self, stream_id: str, *, after: tuple[datetime, str] | None, limit: int
    ) -> list[MemoryRow]:
        rows = [
            r
            for r in self._memories_of(stream_id)
            if after is None or (r["occurred_at"], r["item_id"]) > after
        ]
        return [self._memory_row(r) for r in rows[:limit]]

    def intents(self, stream_id: str, *, status: str | None = None) -> list[IntentRow]:
        rows = [
            r
            for r in self._t.intents.values()
            if r["stream_id"] == stream_id and (status is None or r["status"] == status)
        ]
        rows.sort(key=lambda r: (r["observed_at"], r["item_id"]))
        return [
            IntentRow(
                **{k: v for k, v in r.items() if k not in ("stream_id", "description")},
                description=self._personal(stream_id, r["description"], ""),
            )
            for r in rows
        ]

    def _consents_of(self, stream_id: str) -> list[ConsentRow]:
        rows = [r for r in self._t.consents.values() if r["stream_id"] == stream_id]
        rows.sort(key=lambda r: (r["granted_at"], r["consent_id"]))
        return [ConsentRow(**{k: v for k, v in r.items() if k != "stream_id"}) for r in rows]

    def consents(self, stream_id: str) -> list[ConsentRow]:
        return self._consents_of(stream_id)

    def consents_after(
        self,
        stream_id: str,
        *,
        app_id: str | None,
        after: tuple[datetime, str] | None,
        limit: int,
    ) -> list[ConsentRow]:
        rows = [
            c
            for c in self._consents_of(stream_id)
            if (app_id is None or c.app_id == app_id)
            and (after is None or (c.granted_at, c.consent_id) > after)
        ]
        return rows[:limit]

    def _capture_row(self, r: dict[str, Any]) -> CaptureRow:
        sid = r["stream_id"]
        return CaptureRow(
            capture_id=r["capture_id"],
            stream_id=sid,
            notification_id=r["notification_id"],
            app_id=r["app_id"],
            agent_id=r["agent_id"],
            session_id=self._personal(sid, r["session_id"], ""),
            actor=self._personal(sid, r["actor"], ""),
            purpose=r["purpose"],
            source_ref=self._personal(sid, r["source_ref"], ""),
            user_input=self._personal(sid, r["user_input"], ""),
            agent_response=self._personal(sid, r["agent_response"], ""),
            occurred_at=r["occurred_at"],
            sharing=r["sharing"],
        )

    def captures(self, capture_ids: Iterable[str]) -> dict[str, CaptureRow]:
        return {
            c: self._capture_row(self._t.captures[c])
            for c in sorted(set(capture_ids))
            if c in self._t.captures
        }

    def all_captures(self, stream_id: str) -> list[CaptureRow]:
        rows = [r for r in self._t.captures.values() if r["stream_id"] == stream_id]
        rows.sort(key=lambda r: r["notification_id"])
        return [self._capture_row(r) for r in rows]

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
        return [
            r["capture_id"]
            for r in self._t.captures.values()
            if r["stream_id"] == stream_id
            and r["app_id"] == app_id
            and (after_position is None or r["notification_id"] > after_position)
            and (before_position is None or r["notification_id"] < before_position)
            and (since is None or r["recorded_at"] >= since)
            and (until is None or r["recorded_at"] <= until)
            and ("*" in purposes or r["purpose"] in purposes)
        ]

    def session_activity(self, stream_id: str) -> dict[str, int]:
        return {key: n for (sid, key), n in self._t.sessions.items() if sid == stream_id}

    def captured_source_refs(
        self, stream_id: str, app_id: str, source_refs: Sequence[str]
    ) -> set[str]:
        wanted = {r for r in source_refs if r}
        if not wanted or not self._readable(stream_id):
            return set()
        # The SQL adapter matches keyed hashes of (app, ref); plaintext equality here.
        scopes = {source_ref_scope(app_id, r): r for r in wanted}
        return {
            scopes[source_ref_scope(r["app_id"], r["source_ref"])]
            for r in self._t.captures.values()
            if r["stream_id"] == stream_id
            and r["app_id"] == app_id
            and source_ref_scope(r["app_id"], r["source_ref"]) in scopes
        }

    def item_reads(self, stream_id: str) -> list[tuple[str, str, str, int, datetime]]:
        rows = [
            (item, app, purpose, n, at)
            for (sid, app, purpose, item), (n, at) in self._t.reads.items()
            if sid == stream_id
        ]
        return sorted(rows, key=lambda r: r[4])
