"""The consent gate and capture, on the in-memory stores."""

from __future__ import annotations

import pytest

from domain.errors import ConsentRequiredError, SubjectErasedError
from domain.profile import SubjectProfile
from tests.unit.conftest import World, grant, say


def test_a_capture_without_consent_is_refused_audited_and_not_written(world: World) -> None:
    with pytest.raises(ConsentRequiredError):
        world.capture.capture("alice", say("I live in Paris"))
    assert world.events.max_notification_id() == 0
    assert world.actions() == ["capture.refused"]
    refused = next(world.audit_log.entries())
    assert "Paris" not in refused.entry_json and "alice" not in refused.entry_json


def test_a_granted_consent_lets_the_capture_through_to_the_log(world: World) -> None:
    grant(world)
    ack = world.capture.capture("alice", say("I live in Paris"))
    handle = world.subjects.find("alice")
    assert handle is not None and ack.subject_pseudonym == handle.pseudonym
    [notification] = world.events.notifications_after(ack.notification_id - 1, 1)
    event = world.events.decode(notification)
    assert isinstance(event, SubjectProfile.InteractionCaptured)
    assert (event.capture_id, event.user_input) == (ack.capture_id, "I live in Paris")
    # The subject's key, its consent, the capture and the capture's own key.
    assert world.actions() == ["key.created", "consent.granted", "capture.accepted", "key.created"]


def test_consent_for_one_app_does_not_open_the_gate_for_another(world: World) -> None:
    grant(world, app="app:calendar")
    with pytest.raises(ConsentRequiredError):
        world.capture.capture("alice", say("hello"))
    head = world.events.max_notification_id()
    world.capture.capture("alice", say("hello", app="app:calendar"))
    assert world.events.max_notification_id() > head


def test_a_withdrawn_consent_closes_the_gate_again(world: World) -> None:
    consent_id = grant(world)
    world.capture.capture("alice", say("first"))
    assert world.consent.withdraw("alice", consent_id)
    head = world.events.max_notification_id()
    with pytest.raises(ConsentRequiredError):
        world.capture.capture("alice", say("second"))
    assert world.events.max_notification_id() == head
    assert world.actions()[-2:] == ["consent.withdrawn", "capture.refused"]


def test_a_batch_with_one_refused_interaction_writes_nothing(world: World) -> None:
    grant(world)
    head = world.events.max_notification_id()
    with pytest.raises(ConsentRequiredError):
        world.capture.capture_many(
            "alice", [say("fine"), say("not for this purpose", purpose="marketing")]
        )
    assert world.events.max_notification_id() == head


def test_a_retried_keyed_grant_writes_once(world: World) -> None:
    first = world.consent.grant(
        "alice",
        app_id="app:planner",
        categories=["*"],
        purposes=["personalization"],
        request_token="tok-1",
        token_window_s=3600,
    )
    head = world.events.max_notification_id()
    again = world.consent.grant(
        "alice",
        app_id="app:planner",
        categories=["*"],
        purposes=["personalization"],
        request_token="tok-1",
        token_window_s=3600,
    )
    assert again == first
    assert world.events.max_notification_id() == head
    assert world.actions() == ["key.created", "consent.granted"]


def test_a_subject_whose_keys_are_destroyed_refuses_captures(world: World) -> None:
    grant(world)
    world.capture.capture("alice", say("hello"))
    handle = world.subjects.find("alice")
    assert handle is not None
    world.keys.destroy(str(handle.stream_id), now=world.clock.now())
    with pytest.raises(SubjectErasedError):
        world.events.load(handle.stream_id)
    # The index row went with the keys: the reference names no subject now.
    assert world.subjects.find("alice") is None
    with pytest.raises(ConsentRequiredError):
        world.capture.capture("alice", say("again"))
