"""The aggregate's typed state goes through the real snapshot path (sealed, transcoded)
and loads equal to a replay of its events, in a fresh kernel, on both backends."""

from __future__ import annotations

from domain.profile import AttributeState, IntentState, SubjectProfile
from domain.values import SharingPolicy
from tests.conftest import Backend
from tests.kernel.conftest import FakeClock, build_kernel, consent, say, settings_for


def test_a_snapshot_of_typed_state_loads_equal_to_the_replayed_events(
    backend: Backend, clock: FakeClock
) -> None:
    texts = ["I live in Lisbon", "I am vegetarian", "I want to learn the cello"]
    first = build_kernel(settings_for(backend), clock)
    try:
        consent(first)
        for i, text in enumerate(texts):
            first.capture("alice", say(text, ref=f"first{i}"))
        first.process()  # the attributes exist before the stream crosses the interval
        for i in range(100):  # past the snapshot interval (100 events)
            first.capture("alice", say(texts[i % 3], ref=f"t{i}"))
        first.process()
        stream = first.stream_of("alice")
        assert first.app.snapshots is not None
        (snapshot, *_) = reversed(list(first.app.snapshots.get(stream)))
        held = snapshot.state["attributes"]  # type: ignore[attr-defined]
        assert held and all(isinstance(a, AttributeState) for a in held.values())
    finally:
        first.close()
    second = build_kernel(settings_for(backend), clock)
    try:
        loaded = second.app.load(stream)  # snapshot plus tail
        replayed: SubjectProfile | None = None
        for event in second.app.events.get(stream):  # every event, no snapshot
            replayed = event.mutate(replayed)  # type: ignore[attr-defined]
        assert isinstance(replayed, SubjectProfile)
        assert loaded.attributes and all(
            isinstance(a, AttributeState) for a in loaded.attributes.values()
        )
        assert loaded.attributes == replayed.attributes
        assert loaded.consents == replayed.consents
        assert loaded.intents == replayed.intents
    finally:
        second.close()


def test_an_intent_from_a_snapshot_taken_before_sharing_was_kept_is_matched_as_private() -> None:
    """Snapshots before 2026-12-05 hold intents without ``sharing``: they still load, and
    such an intent is matched by its owner's proposals only (fail closed)."""
    from uprof.eventstore import ValueObjectAsDict

    older = {
        "norm": "learn the cello",
        "category": "goal",
        "evidence": ["c1"],
        "confidence": 0.6,
        "expires_at": None,
        "owner_agent": "app:planner/agent:one",
    }
    intent = ValueObjectAsDict(IntentState).decode(older)
    assert intent.sharing == "private"
    assert (
        SharingPolicy.parse(intent.sharing).allows(
            owner_agent=intent.owner_agent,
            reader_agent="app:planner/agent:two",
            reader_agent_type="",
        )
        is False
    )


def test_a_snapshot_keeps_the_archived_memories(backend: Backend, clock: FakeClock) -> None:
    """``archived_memories`` (class version 3) goes through the sealed snapshot path and
    loads equal to a replay: a process loading from the snapshot archives nothing again."""
    from uprof.services.maintenance import MaintenanceService

    first = build_kernel(settings_for(backend), clock)
    try:
        consent(first)
        first.capture_many("alice", [say(f"note number {i}", day=1 + i) for i in range(5)])
        first.process()
        first.maintenance = MaintenanceService(first.app, first.subjects, first.queries, capacity=3)
        assert first.run_maintenance()["memories_archived"] == 2
        stream = first.stream_of("alice")
        first.app.take_snapshot(stream)
        assert first.app.snapshots is not None
        (snapshot, *_) = reversed(list(first.app.snapshots.get(stream)))
        assert len(snapshot.state["archived_memories"]) == 2  # type: ignore[attr-defined]
    finally:
        first.close()
    second = build_kernel(settings_for(backend), clock)
    try:
        loaded = second.app.load(stream)
        replayed: SubjectProfile | None = None
        for event in second.app.events.get(stream):
            replayed = event.mutate(replayed)  # type: ignore[attr-defined]
        assert isinstance(replayed, SubjectProfile)
        assert isinstance(loaded.archived_memories, set)
        assert loaded.archived_memories == replayed.archived_memories
        assert len(loaded.archived_memories) == 2
        # Views that do not show the archive yet choose the same memories: nothing to do.
        cold = sorted(loaded.archived_memories)
        assert loaded.archive_memories(cold, reason="cold") == []
        assert not loaded.pending_events
    finally:
        second.close()
