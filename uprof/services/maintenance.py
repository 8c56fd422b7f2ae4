"""The decay job: expire overdue intents and archive cold memories, as events."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from domain.errors import SubjectErasedError, SubjectNotFoundError
from domain.heat import heat
from uprof.ports import EventStore, ViewStore
from uprof.services.subjects import SubjectResolver

#: MemoryOS-style eviction: past this many active memories a subject's coldest
#: memories leave retrieval (they stay in the log and keep backing evidence).
ACTIVE_MEMORY_CAPACITY = 10_000
#: Memories this important are never evicted for being cold.
KEEP_IMPORTANCE = 0.7


class MaintenanceService:
    def __init__(
        self,
        app: EventStore,
        subjects: SubjectResolver,
        queries: ViewStore,
        capacity: int = ACTIVE_MEMORY_CAPACITY,
    ) -> None:
        self._app = app
        self._subjects = subjects
        self._queries = queries
        self._capacity = capacity

    def run(self, *, now: datetime) -> dict[str, int]:
        expired = archived = 0
        for stream_id in self._subjects.stream_ids():
            try:
                e, a = self._run_subject(stream_id, now)
            except (SubjectErasedError, SubjectNotFoundError):
                continue
            expired += e
            archived += a
        return {"intents_expired": expired, "memories_archived": archived}

    def _cold_memories(self, stream_id: str, now: datetime) -> list[str]:
        """The coldest memories beyond capacity, by heat, never the important ones."""
        memories, _ = self._queries.memories(stream_id)
        excess = len(memories) - self._capacity
        if excess <= 0:
            return []
        sessions = self._queries.session_activity(stream_id)
        scored = sorted(
            (
                heat(
                    visits=m.visits,
                    interactions=sessions.get(m.session_key, 0),
                    last_touched=m.last_visited_at or m.occurred_at,
                    now=now,
                ),
                m.item_id,
            )
            for m in memories
            if m.importance < KEEP_IMPORTANCE
        )
        return [item_id for _, item_id in scored[:excess]]

    def _run_subject(self, stream_id: UUID, now: datetime) -> tuple[int, int]:
        cold = self._cold_memories(str(stream_id), now)

        def command() -> tuple[int, int]:
            # The aggregate knows which intents are active and which memories archived:
            # work another process (or this one's lost attempt) did is not done again,
            # and a save that lost to another process's reloads and finds it done.
            profile = self._app.load(stream_id)
            expired = profile.expire_intents(now)
            archived = profile.archive_memories(cold, reason="cold")
            if profile.pending_events:
                self._app.save(profile)
            return len(expired), len(archived)

        return self._app.with_retry(command)
