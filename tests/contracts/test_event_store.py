"""EventStore contract: the in-memory fake, SQLite and PostgreSQL behave alike."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import uuid4

import pytest

from domain.errors import (
    ConcurrencyConflictError,
    PositionMovedError,
    SubjectErasedError,
    SubjectNotFoundError,
)
from domain.profile import SubjectProfile
from domain.values import Interaction
from tests.contracts.conftest import Stores
from uprof.eventstore import CAPTURED_TOPIC, SNAPSHOT_INTERVAL
from uprof.recorders import GuardedTracking

TENANT = "default"
NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def new_subject(stores: Stores, ref: str = "alice") -> SubjectProfile:
    """A subject with its keys and a first consent, saved."""
    handle = stores.keys().resolve_or_create(TENANT, ref, now=NOW)
    profile = SubjectProfile(id=handle.stream_id, tenant=TENANT)
    grant(profile)
    stores.events().save(profile)
    return profile


def grant(profile: SubjectProfile, app: str = "app:planner") -> str:
    return profile.grant_consent(
        app_id=app,
        categories=("*",),
        purposes=("personalization",),
        legal_basis="consent",
        granted_at=NOW,
    )


def capture(stores: Stores, profile: SubjectProfile, text: str) -> str:
    """Record one interaction, with its capture key created first (as the services do)."""
    interaction = Interaction(
        app_id="app:planner",
        agent_id="app:planner/agent:one",
        occurred_at=NOW,
        user_input=text,
        purpose="personalization",
    )
    capture_id = profile.capture(interaction, now=NOW)
    stores.keys().create_capture_keys(str(profile.id), [capture_id], now=NOW)
    return capture_id


class EventStoreContract:
    """What every EventStore must do (bound to a flavour by the classes at the end)."""

    def test_a_saved_subject_loads_back_at_its_version(self, stores: Stores) -> None:
        profile = new_subject(stores)
        loaded = stores.events().load(profile.id)
        assert loaded.version == profile.version == 2
        assert loaded.consents == profile.consents
        assert stores.events().exists(profile.id)
        assert not stores.events().exists(uuid4())

    def test_an_unknown_stream_is_not_found(self, stores: Stores) -> None:
        with pytest.raises(SubjectNotFoundError):
            stores.events().load(uuid4())

    def test_a_stale_version_is_refused_and_nothing_is_written(self, stores: Stores) -> None:
        events = stores.events()
        profile = new_subject(stores)
        first, second = events.load(profile.id), events.load(profile.id)
        grant(first, "app:one")
        events.save(first)
        head = events.max_notification_id()
        grant(second, "app:two")
        with pytest.raises(ConcurrencyConflictError):
            events.save(second)
        assert events.max_notification_id() == head
        assert sorted(c.app_id for c in events.load(profile.id).consents.values()) == [
            "app:one",
            "app:planner",
        ]

    def test_a_save_of_two_subjects_is_all_or_nothing(self, stores: Stores) -> None:
        events = stores.events()
        alice, bob = new_subject(stores, "alice"), new_subject(stores, "bob")
        stale_bob = events.load(bob.id)
        grant(events.load(bob.id), "app:x")  # not saved: only the loaded copy changed
        moved = events.load(bob.id)
        grant(moved, "app:moved")
        events.save(moved)
        head = events.max_notification_id()
        fresh_alice = events.load(alice.id)
        grant(fresh_alice, "app:one")
        grant(stale_bob, "app:two")
        with pytest.raises(ConcurrencyConflictError):
            events.save(fresh_alice, stale_bob)
        assert events.max_notification_id() == head
        assert events.load(alice.id).version == alice.version

    def test_with_retry_runs_the_command_again_after_a_conflict(self, stores: Stores) -> None:
        events = stores.events()
        profile = new_subject(stores)
        attempts = 0

        def command() -> int:
            nonlocal attempts
            attempts += 1
            mine = events.load(profile.id)
            if attempts == 1:  # another writer saves between this load and its save
                theirs = events.load(profile.id)
                grant(theirs, "app:theirs")
                events.save(theirs)
            grant(mine, f"app:mine{attempts}")
            events.save(mine)
            return mine.version

        assert events.with_retry(command, subject=profile.id) == 4
        assert attempts == 2

    def test_notifications_come_back_in_order_after_a_position(self, stores: Stores) -> None:
        events = stores.events()
        alice = new_subject(stores, "alice")
        bob = new_subject(stores, "bob")
        for text in ("one", "two", "three"):
            capture(stores, alice, text)
            events.save(alice)
        capture(stores, bob, "four")
        events.save(bob)
        every = events.notifications_after(0, 100)
        ids = [n.id for n in every]
        assert ids == sorted(ids) and len(set(ids)) == len(ids) == 8
        assert ids[-1] == events.max_notification_id()
        after = events.notifications_after(ids[2], 3)
        assert [n.id for n in after] == ids[3:6]
        assert events.notifications_after(ids[-1], 10) == []
        captured = events.notifications_after(0, 100, topics=[CAPTURED_TOPIC])
        assert [n.id for n in captured] == [n.id for n in every if n.topic == CAPTURED_TOPIC]
        texts = [events.decode(n).user_input for n in captured]
        assert texts == ["one", "two", "three", "four"]
        decoded = [events.decode(n) for n in every]
        assert [(e.originator_id, e.originator_version) for e in decoded] == [
            (n.originator_id, n.originator_version) for n in every
        ]

    def test_notification_ids_name_each_versions_position(self, stores: Stores) -> None:
        events = stores.events()
        profile = new_subject(stores)
        capture(stores, profile, "hello")
        events.save(profile)
        by_version = {
            n.originator_version: n.id
            for n in events.notifications_after(0, 100)
            if n.originator_id == profile.id
        }
        assert events.notification_ids(profile.id, [3, 1]) == [by_version[3], by_version[1]]

    def test_stream_events_are_every_event_in_version_order(self, stores: Stores) -> None:
        events = stores.events()
        profile = new_subject(stores)
        capture(stores, profile, "hello")
        events.save(profile)
        stream = events.stream_events(profile.id)
        assert [e.originator_version for e in stream] == [1, 2, 3]
        assert isinstance(stream[-1], SubjectProfile.InteractionCaptured)

    def test_a_guarded_position_moves_only_from_where_it_started(self, stores: Stores) -> None:
        events = stores.events()
        profile = new_subject(stores)
        assert events.tracking_position("worker") == 0
        events.save_tracked([], GuardedTracking("worker", 2, expected=0))
        assert events.tracking_position("worker") == 2
        head = events.max_notification_id()
        grant(profile, "app:late")
        with pytest.raises(PositionMovedError):  # another worker already moved it from 0
            events.save_tracked([profile], GuardedTracking("worker", 3, expected=0))
        assert events.tracking_position("worker") == 2
        assert events.max_notification_id() == head  # the batch's events rolled back too
        events.save_tracked([events.load(profile.id)], GuardedTracking("worker", 5, expected=2))
        assert events.tracking_position("worker") == 5

    def test_a_check_position_starts_once_and_moves_only_from_where_it_stands(
        self, stores: Stores
    ) -> None:
        """The late check's position beside a worker's (decision 0112-late-check-durable):
        started once (a second start keeps it), moved by compare-and-set, apart from
        the worker positions; durable (another store object on the same database)."""
        events = stores.events()
        assert events.check_position("check:worker") is None
        assert events.start_check_position("check:worker", 4) == 4
        assert events.start_check_position("check:worker", 9) == 4  # started already
        assert events.move_check_position("check:worker", 4, 7) is True
        assert events.move_check_position("check:worker", 4, 8) is False  # moved meanwhile
        assert events.check_position("check:worker") == 7
        assert events.tracking_position("worker") == 0  # a row of its own
        events.save_tracked([], GuardedTracking("worker", 3, expected=0))
        assert events.check_position("check:worker") == 7

    def test_catch_up_brings_a_stale_copy_to_the_head(self, stores: Stores) -> None:
        events = stores.events()
        profile = new_subject(stores)
        stale = events.load(profile.id)
        newer = events.load(profile.id)
        grant(newer, "app:newer")
        events.save(newer)
        caught = events.catch_up(stale)
        assert caught.version == newer.version
        assert caught.consents == newer.consents
        assert events.catch_up_many([stale])[profile.id].version == newer.version  # type: ignore[union-attr]

    def test_a_shredded_subject_no_longer_loads_and_its_content_is_gone(
        self, stores: Stores
    ) -> None:
        events = stores.events()
        profile = new_subject(stores)
        capture(stores, profile, "my secret")
        events.save(profile)
        stores.keys().destroy(str(profile.id), now=NOW)
        with pytest.raises(SubjectErasedError):
            events.load(profile.id)
        decoded = [events.decode(n) for n in events.notifications_after(0, 100)]
        assert all(isinstance(e, SubjectProfile.ContentShredded) for e in decoded)
        assert isinstance(events.catch_up_many([profile])[profile.id], SubjectErasedError)

    def test_snapshots_are_taken_at_the_interval_and_can_be_dropped(self, stores: Stores) -> None:
        events = stores.events()
        profile = new_subject(stores)
        for i in range(SNAPSHOT_INTERVAL):
            grant(profile, f"app:a{i}")
        events.save(profile)
        assert events.drop_snapshots(profile.id) == 1
        assert events.drop_snapshots(profile.id) == 0
        reloaded = events.load(profile.id)  # from the events alone now
        assert reloaded.version == profile.version == SNAPSHOT_INTERVAL + 2
        assert len(reloaded.consents) == SNAPSHOT_INTERVAL + 1


class TestEventStoreInMemory(EventStoreContract):
    @pytest.fixture
    def stores(self, memory_stores: Stores) -> Stores:
        return memory_stores


class TestEventStoreOnDatabase(EventStoreContract):
    @pytest.fixture
    def stores(self, database_stores: Stores) -> Stores:
        return database_stores
