"""Identity resolution and the erased-subject refusal, on the in-memory key store."""

from __future__ import annotations

import pytest

from domain.errors import (
    ConsentRequiredError,
    IdentityError,
    SubjectErasedError,
    SubjectNotFoundError,
)
from tests.unit.conftest import TENANT, World, grant, say
from uprof.services.subjects import SubjectRequest


def test_a_session_and_an_identifier_resolve_to_their_subject(world: World) -> None:
    grant(world, "alice")
    now = world.clock.now()
    world.subjects.register_session("sess-1", "alice", now=now)
    world.subjects.register_identifier("Alice@Example.org ", "alice", now=now)
    alice = world.subjects.find("alice")
    assert alice is not None
    for request in (
        SubjectRequest(session_id="sess-1"),
        SubjectRequest(identifier="alice@example.org"),
        SubjectRequest(subject="alice", session_id="sess-1"),
    ):
        assert world.subjects.resolve(request).stream_id == alice.stream_id


def test_sources_that_name_different_subjects_are_refused_not_guessed(world: World) -> None:
    grant(world, "alice")
    grant(world, "bob")
    world.subjects.register_session("sess-1", "bob", now=world.clock.now())
    with pytest.raises(IdentityError, match="ambiguous"):
        world.subjects.resolve(SubjectRequest(subject="alice", session_id="sess-1"))


def test_a_request_may_not_name_the_calling_agent_or_nobody(world: World) -> None:
    grant(world, "agent:one")
    with pytest.raises(IdentityError):
        world.subjects.resolve(SubjectRequest(subject="agent:one"), calling_agent="agent:one")
    with pytest.raises(IdentityError):
        world.subjects.resolve(SubjectRequest())
    with pytest.raises(SubjectNotFoundError):
        world.subjects.resolve(SubjectRequest(subject="nobody"))


def test_a_subject_marked_erased_in_the_ledger_refuses_writes_until_recreated(
    world: World,
) -> None:
    grant(world, "alice")
    alice = world.subjects.find("alice")
    assert alice is not None and world.keys.ledger is not None
    # What the erasure service does, in its order: ledger record first, then the keys.
    world.keys.ledger.record_subject(TENANT, "alice", str(alice.stream_id))
    world.keys.destroy(str(alice.stream_id), now=world.clock.now())
    with pytest.raises(SubjectErasedError):
        world.subjects.find("alice")
    with pytest.raises(SubjectErasedError):
        grant(world, "alice")
    with pytest.raises(SubjectErasedError):
        world.capture.capture("alice", say("hello"))
    assert world.actions()[-1] == "capture.refused"
    world.keys.ledger.record_recreated(TENANT, "alice")
    grant(world, "alice")  # a new subject, unlinked to the old
    again = world.subjects.find("alice")
    assert again is not None and again.stream_id != alice.stream_id
    with pytest.raises(ConsentRequiredError):
        world.capture.capture("alice", say("hello", app="app:calendar"))
