"""InMemoryEventStore: the EventStore port over eventsourcing's in-memory (POPO) recorder.

It is the profiles application with only its storage swapped: the same mapper (events
sealed under the fake key store's keys), the same load, catch-up, snapshot and retry
logic, and the same domain errors; the SQL-only parts (raw head queries, snapshot
DELETE, partition claims) are answered from the in-memory recorder instead.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from uuid import UUID

from eventsourcing.persistence import EventStore, ProcessRecorder, StoredEvent, Tracking
from eventsourcing.popo import POPOAggregateRecorder, POPOProcessRecorder

from domain.errors import PositionMovedError
from uprof.eventstore import WRITER_STRIPES, ProfilesApplication, SubjectHeads
from uprof.ports import SubjectKeyStore
from uprof.recorders import ConflictsAsDomainErrors, GuardedTracking


class GuardedPOPOProcessRecorder(POPOProcessRecorder):
    """POPO process recorder whose guarded tracking is a compare-and-set (as the SQL ones)."""

    guards_tracking = True

    def _assert_tracking_uniqueness(self, tracking: Tracking) -> None:
        if isinstance(tracking, GuardedTracking):
            current = self._max_tracking_ids[tracking.application_name] or 0
            if current != tracking.expected:
                raise PositionMovedError(
                    tracking.application_name, tracking.expected, tracking.notification_id
                )
            return
        super()._assert_tracking_uniqueness(tracking)


class InMemoryEventStore(ProfilesApplication):
    """Profiles log in memory: nothing outlives the object."""

    def __init__(self, keystore: SubjectKeyStore) -> None:
        # The SQL constructor opens an engine and migrates; this one skips straight to
        # the library application with in-memory persistence.
        self._keystore = keystore
        self.log_id = "memory"
        self._writer_turns = [threading.RLock() for _ in range(WRITER_STRIPES)]
        self._checks: dict[str, int] = {}
        self._check_lock = threading.Lock()
        ConflictsAsDomainErrors.__init__(self, {"PERSISTENCE_MODULE": "eventsourcing.popo"})

    def construct_recorder(self) -> ProcessRecorder:
        return GuardedPOPOProcessRecorder()

    def construct_snapshot_store(self) -> EventStore[UUID]:
        # The library's own: in memory there is no table whose shape could change.
        return ConflictsAsDomainErrors.construct_snapshot_store(self)

    @property
    def _memory(self) -> GuardedPOPOProcessRecorder:
        assert isinstance(self.recorder, GuardedPOPOProcessRecorder)
        return self.recorder

    def stream_versions(self, stream_ids: Sequence[UUID]) -> dict[UUID, int]:
        heads = {s: self._memory.select_events(s, desc=True, limit=1) for s in stream_ids}
        return {s: rows[0].originator_version for s, rows in heads.items() if rows}

    def notification_ids(self, stream_id: UUID, versions: Sequence[int]) -> list[int]:
        # POPO notification ids are 1-based positions in the one list of stored events.
        index = self._memory._stored_events_index[str(stream_id)]
        return [index[int(v)] + 1 for v in versions]

    def drop_snapshots(self, stream_id: UUID) -> int:
        if self.snapshots is None:
            return 0
        recorder = self.snapshots.recorder
        assert isinstance(recorder, POPOAggregateRecorder)
        with recorder._database_lock:
            positions = recorder._stored_events_index.pop(str(stream_id), {})
            for p in positions.values():  # overwrite the rows too: no state left behind
                old = recorder._stored_events[p]
                recorder._stored_events[p] = StoredEvent(
                    old.originator_id, old.originator_version, old.topic, b""
                )
        return len(positions)

    def subject_heads(self, stream_id: UUID, *, worker: str | None = None) -> SubjectHeads:
        raise NotImplementedError("not part of the EventStore port (the kernel's freshness)")

    def claim_partitioning(self, count: int) -> None:
        raise NotImplementedError("not part of the EventStore port (bootstrap's partitions)")

    def check_position(self, name: str) -> int | None:
        with self._check_lock:
            return self._checks.get(name)

    def start_check_position(self, name: str, at: int) -> int:
        with self._check_lock:
            return self._checks.setdefault(name, at)

    def move_check_position(self, name: str, expected: int, to: int) -> bool:
        with self._check_lock:
            if self._checks.get(name) != expected:
                return False
            self._checks[name] = to
            return True

    def snapshot_count(self, stream_id: UUID) -> int:
        """How many snapshots the stream has (for tests)."""
        if self.snapshots is None:
            return 0
        return len(self.snapshots.recorder.select_events(stream_id))

    def __repr__(self) -> str:
        return f"InMemoryEventStore(max_notification_id={self.max_notification_id()})"
