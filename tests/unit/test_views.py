"""Read models on the in-memory view store: profile views, evidence checks, erasure purge."""

from __future__ import annotations

import pytest

from domain.errors import EvidenceError
from domain.values import AttributeProposal, ProposalBatch
from tests.fakes.ports import FakeExtractor
from tests.unit.conftest import APP, World, grant, say
from uprof.crypto.fields import ViewSealer
from uprof.services.extraction import EvidenceChecker, ExtractionWorker
from uprof.services.profile import ProfileService
from uprof.services.proposals import ProposalService


def extract(world: World) -> None:
    ExtractionWorker(
        world.events, FakeExtractor(), EvidenceChecker(world.views), world.clock
    ).run_until_idle()
    world.project()


def profiles(world: World) -> ProfileService:
    return ProfileService(world.events, world.views, ViewSealer(world.keys))  # type: ignore[arg-type]


def proposals(world: World) -> ProposalService:
    return ProposalService(
        world.events, world.subjects, EvidenceChecker(world.views), world.clock, world.audit
    )


def stream_of(world: World, subject: str = "alice") -> str:
    handle = world.subjects.find(subject)
    assert handle is not None
    return str(handle.stream_id)


def location(evidence: tuple[str, ...], value: str = "Paris") -> ProposalBatch:
    return ProposalBatch(
        (AttributeProposal("home_location", value, evidence, 0.9),),
        author="agent",
        owner_agent="agent:one",
        app_id=APP,
    )


def test_a_capture_becomes_a_profile_view_with_its_evidence(world: World) -> None:
    grant(world)
    ack = world.capture.capture("alice", say("I live in Paris and I want to learn to cook"))
    extract(world)
    handle = world.subjects.find("alice")
    assert handle is not None
    view = profiles(world).current(handle.stream_id)
    assert [(a.key, a.value) for a in view.attributes] == [("home_location", "Paris")]
    assert [i.description for i in view.intents] == ["learn to cook"]
    assert [m.text for m in view.memories] == ["I live in Paris and I want to learn to cook"]
    assert {a.evidence for a in view.attributes} == {(ack.capture_id,)}
    shown = profiles(world).evidence(handle.stream_id, view.attributes[0].item_id)
    assert [c.user_input for c in shown.captures] == ["I live in Paris and I want to learn to cook"]


def test_a_proposal_may_cite_a_projected_capture_of_its_own_subject(world: World) -> None:
    grant(world)
    ack = world.capture.capture("alice", say("hello"))
    world.project()
    assert proposals(world).submit("alice", location((ack.capture_id,))) == 1
    world.project()
    (attribute,) = world.views.attributes(stream_of(world))
    assert attribute.evidence == (ack.capture_id,)


def test_a_proposal_citing_another_subjects_capture_is_refused(world: World) -> None:
    grant(world, "alice")
    grant(world, "bob")
    world.capture.capture("alice", say("hello"))
    bobs = world.capture.capture("bob", say("I live in Oslo"))
    world.project()
    head = world.events.max_notification_id()
    with pytest.raises(EvidenceError, match="of this subject"):
        proposals(world).submit("alice", location((bobs.capture_id,), "Oslo"))
    with pytest.raises(EvidenceError, match="does not name"):
        proposals(world).submit("alice", location(("no-such-capture",)))
    assert world.events.max_notification_id() == head  # nothing written
    assert "proposal.applied" not in world.actions()


def test_an_erased_subjects_views_are_gone_and_others_stay(world: World) -> None:
    grant(world, "alice")
    grant(world, "bob")
    world.capture.capture("alice", say("I live in Paris and I want to learn to cook"))
    kept = world.capture.capture("bob", say("I live in Oslo"))
    extract(world)
    alice, bob = stream_of(world, "alice"), stream_of(world, "bob")
    assert world.views.attributes(alice) and world.views.all_captures(alice)
    # The cascade's steps on the stores: tombstone, key destruction, projection.
    profile = world.events.load(world.subjects.find("alice").stream_id)  # type: ignore[union-attr]
    profile.erase(request_id="req-1", basis="art17", now=world.clock.now())
    world.events.save(profile)
    world.keys.destroy(alice, now=world.clock.now())
    world.project()
    assert world.views.attributes(alice) == []
    assert world.views.memories(alice, include_archived=True)[0] == []
    assert world.views.intents(alice) == []
    assert world.views.consents(alice) == []
    assert world.views.all_captures(alice) == []
    assert world.views.session_activity(alice) == {}
    assert [c.capture_id for c in world.views.all_captures(bob)] == [kept.capture_id]
    assert [a.value for a in world.views.attributes(bob)] == ["Oslo"]


def test_projecting_twice_applies_nothing_twice(world: World) -> None:
    grant(world)
    world.capture.capture("alice", say("I live in Paris"))
    extract(world)
    before = world.views.session_activity(stream_of(world))
    assert world.project() == 0
    assert world.views.session_activity(stream_of(world)) == before == {next(iter(before)): 1}
