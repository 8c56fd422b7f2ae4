"""Capture to extraction to profile, on the in-memory stores, with the seeded policy."""

from __future__ import annotations

from domain.profile import SubjectProfile
from policies import CasbinAuthorizer
from tests.fakes.ports import FakeExtractor
from tests.unit.conftest import TENANT, World, grant, say
from uprof.bootstrap import capture_permits
from uprof.services.extraction import EvidenceChecker, ExtractionWorker


def worker(world: World, *, policy: bool) -> ExtractionWorker:
    return ExtractionWorker(
        world.events,
        FakeExtractor(),
        EvidenceChecker(world.views),
        world.clock,
        may_capture=capture_permits(lambda _tenant: CasbinAuthorizer.seeded()) if policy else None,
        tenant=TENANT,
    )


def profile_of(world: World, subject: str = "alice") -> SubjectProfile:
    handle = world.subjects.find(subject)
    assert handle is not None
    return world.events.load(handle.stream_id)


def test_extraction_turns_a_capture_into_profile_items_exactly_once(world: World) -> None:
    grant(world)
    ack = world.capture.capture("alice", say("I want to learn Italian"))
    extraction = worker(world, policy=False)
    assert extraction.lag() == 1
    assert extraction.run_until_idle() > 0
    assert extraction.lag() == 0
    assert extraction.position == ack.notification_id
    assert world.events.max_notification_id() > ack.notification_id
    topics = [type(e).__name__ for e in world.events.stream_events(profile_of(world).id)]
    assert topics.count("IntentRecorded") == 1 and topics.count("MemoryRecorded") == 1
    assert extraction.run_until_idle() == 0  # nothing twice
    again = [type(e).__name__ for e in world.events.stream_events(profile_of(world).id)]
    assert again == topics


def test_without_a_policy_limit_a_capture_may_yield_a_location(world: World) -> None:
    grant(world)
    world.capture.capture("alice", say("I live in Paris"))
    worker(world, policy=False).run_until_idle()
    values = {a.key: a.value for a in profile_of(world).attributes.values()}
    assert values == {"home_location": "Paris"}


def test_the_policy_drops_what_the_capturing_app_may_not_write(world: World) -> None:
    # The seeded policy lets schedulers (app:calendar) capture schedules, goals and
    # conversation, not location: the home_location proposal is denied and dropped.
    world.consent.grant("alice", app_id="app:calendar", categories=["*"], purposes=["scheduling"])
    world.capture.capture(
        "alice",
        say(
            "I live in Paris and I want to learn Italian", app="app:calendar", purpose="scheduling"
        ),
    )
    worker(world, policy=True).run_until_idle()
    profile = profile_of(world)
    assert profile.attributes == {}
    topics = [type(e).__name__ for e in world.events.stream_events(profile.id)]
    assert "IntentRecorded" in topics and "MemoryRecorded" in topics


def test_a_subject_erased_before_extraction_gets_nothing_extracted(world: World) -> None:
    grant(world)
    world.capture.capture("alice", say("I live in Paris"))
    handle = world.subjects.find("alice")
    assert handle is not None
    world.keys.destroy(str(handle.stream_id), now=world.clock.now())
    head = world.events.max_notification_id()
    extraction = worker(world, policy=False)
    extraction.run_until_idle()
    assert world.events.max_notification_id() == head  # no derived events
    assert extraction.position == head  # but the position moved past the capture
