"""The unit tier: services and domain on the in-memory fakes, no database, no network.

Run alone with ``pytest tests/unit`` (or ``-m unit`` across the tree); every test here
is marked ``unit`` and sockets are disabled (P12), so a hidden connection fails loudly.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import pytest
from pytest_socket import disable_socket, enable_socket

from domain.values import Interaction
from projections.profile.projector import embed_memories
from tests.fakes.audit import InMemoryAuditStore
from tests.fakes.eventstore import InMemoryEventStore
from tests.fakes.keystore import InMemoryKeyStore
from tests.fakes.ports import FakeClock, InMemoryKeyMaterialStore
from tests.fakes.views import InMemoryViewStore
from uprof.adapters.audit_trail import AuditLogTrail
from uprof.crypto.ledger import ErasureLedger
from uprof.services.capture import CaptureService
from uprof.services.consent import ConsentService
from uprof.services.projection import ProjectionRunner
from uprof.services.subjects import SubjectResolver

TENANT = "default"
APP = "app:planner"
_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(_HERE):
            item.add_marker(pytest.mark.unit)


@pytest.fixture(autouse=True)
def _no_network() -> Iterator[None]:
    disable_socket(allow_unix_socket=False)
    try:
        yield
    finally:
        enable_socket()


@dataclass
class World:
    """The services of one deployment, wired on fakes (what bootstrap wires on SQL)."""

    clock: FakeClock
    keys: InMemoryKeyStore
    events: InMemoryEventStore
    audit_log: InMemoryAuditStore
    views: InMemoryViewStore
    audit: AuditLogTrail
    subjects: SubjectResolver
    consent: ConsentService
    capture: CaptureService
    #: The production runner over the fake stores (no model: memories get no vectors).
    projections: ProjectionRunner

    def actions(self) -> list[str]:
        return [e.entry["action"] for e in self.audit_log.entries()]

    def project(self) -> int:
        """Bring the views up to the log's head; how many notifications that took."""
        return self.projections.run_until_idle()


@pytest.fixture
def world() -> Iterator[World]:
    clock = FakeClock(datetime(2026, 1, 1, 12, tzinfo=UTC))
    ledger = ErasureLedger(InMemoryKeyMaterialStore(), secrets.token_bytes(32))
    keys = InMemoryKeyStore(ledger=ledger)
    events = InMemoryEventStore(keys)
    audit_log = InMemoryAuditStore(clock=clock.now)
    # The production trail over the fake log: entries are validated as in production.
    audit = AuditLogTrail(audit_log, TENANT)
    subjects = SubjectResolver(keys, TENANT)
    views = InMemoryViewStore(keys)
    world = World(
        clock=clock,
        keys=keys,
        events=events,
        audit_log=audit_log,
        views=views,
        audit=audit,
        subjects=subjects,
        consent=ConsentService(events, subjects, clock, audit),
        capture=CaptureService(events, subjects, keys, clock, audit),
        projections=ProjectionRunner(events, views, partial(embed_memories, None)),
    )
    try:
        yield world
    finally:
        world.projections.close()  # its embedding thread


def say(text: str, *, app: str = APP, purpose: str = "personalization") -> Interaction:
    return Interaction(
        app_id=app,
        agent_id="agent:one",
        occurred_at=datetime(2025, 1, 1, 9, tzinfo=UTC),
        user_input=text,
        purpose=purpose,
        session_id="s1",
    )


def grant(world: World, subject: str = "alice", app: str = APP) -> str:
    return world.consent.grant(subject, app_id=app, categories=["*"], purposes=["personalization"])
