"""A damaged stored event not yet extracted is quarantined by its log position (both
backends).

A byte flipped in one stored capture's ciphertext (disk damage, a bad copy) makes it fail
authentication: the mapper raises ``DamagedEventError``. Before this change the pipeline
stopped at it, so no later capture of *any* subject of its partition was extracted or
projected until the damaged subject was erased or the stores restored (decision 0119,
"Left"). Now the extraction batch sets it aside by its notification id, with the batch's
guarded position, and the partition goes on.
"""

from __future__ import annotations

from uuid import UUID

import pytest
import sqlalchemy as sa
from eventsourcing.utils import get_topic

from domain.errors import StoredDataDamagedError, SubjectErasedError
from domain.profile import SubjectProfile
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, consent, running, say, settings_for
from uprof.kernel import Uprof

CANARY = "Qzxdamagedcanary"
BYSTANDER = "Qzxbystandercanary"


def damage(kernel: Uprof, stream: UUID, nth_capture: int = 0) -> int:
    """Flip the last byte (inside the GCM tag) of one stored capture of ``stream``, in
    the stored row itself; return that event's notification id."""
    app = kernel.app
    table = app.recorder.events_table_name  # type: ignore[attr-defined]
    key = app.backend.stream_key(stream)
    with app.events_engine.begin() as conn:
        rows = conn.execute(
            sa.text(
                f"SELECT originator_version, topic, state FROM {table} "
                "WHERE originator_id = :s ORDER BY originator_version"
            ),
            {"s": key},
        ).all()
        version, _, state = [r for r in rows if "InteractionCaptured" in r[1]][nth_capture]
        conn.execute(
            sa.text(
                f"UPDATE {table} SET state = :st WHERE originator_id = :s "
                "AND originator_version = :v"
            ),
            {"st": bytes(state[:-1]) + bytes([state[-1] ^ 0x01]), "s": key, "v": version},
        )
    found = [
        n.id
        for n in app.notifications_after(0, 10_000)
        if n.originator_id == stream and n.originator_version == version
    ]
    return int(found[0])


def memories(kernel: Uprof, subject: str) -> list[str]:
    return sorted(m.text for m in kernel.profile(subject).memories)


def set_aside(kernel: Uprof) -> list[object]:
    """The log's ``DamagedEventQuarantined`` events."""
    topic = get_topic(SubjectProfile.DamagedEventQuarantined)
    return [
        kernel.app.decode(n) for n in kernel.app.notifications_after(0, 10_000, topics=(topic,))
    ]


def _damaged_before_extraction(backend: Backend, clock: FakeClock) -> int:
    with running(settings_for(backend), clock) as k:
        consent(k, "alice")
        consent(k, "bob")
        k.process()
        k.capture_many("alice", [say(f"I met {CANARY} at the market", ref="a-1")])
        k.capture_many("bob", [say(f"I met {BYSTANDER} at the market", ref="b-1")])
        return damage(k, k.stream_of("alice"))


def test_a_damaged_capture_does_not_stop_other_subjects_extraction(
    backend: Backend, clock: FakeClock
) -> None:
    """On main at 1580de9 ``process()`` raised ``MapperDeserialisationError`` every time
    and bob's capture, after alice's damaged one, was never extracted."""
    nid = _damaged_before_extraction(backend, clock)
    with running(settings_for(backend), clock) as k:
        k.process()
        assert memories(k, "bob") == [f"I met {BYSTANDER} at the market"]
        # One verdict, by log position; listed with the 0087 quarantine.
        [verdict] = set_aside(k)
        assert verdict.notification_id == nid  # type: ignore[attr-defined]
        [listed] = k.quarantined()
        assert listed.notification_id == nid
        assert listed.stage == "damaged"
        assert listed.error == "DamagedEventError"
        assert k.lag().quarantined == 1
        # alice's damaged capture is not served as extracted: her reads fail closed.
        with pytest.raises(StoredDataDamagedError):
            k.slice(
                "alice",
                "market",
                budget_tokens=200,
                purpose="personalization",
                app_id=APP,
                agent_id="agent:one",
            )
        # The next capture of bob is extracted too, and nothing is set aside twice.
        k.capture_many("bob", [say("I met Qzxsecondcanary at the market", ref="b-2")])
        k.process()
        assert len(memories(k, "bob")) == 2
        assert len(set_aside(k)) == 1
    # Another start (another process) agrees and records nothing again.
    with running(settings_for(backend), clock) as k:
        k.process()
        assert len(set_aside(k)) == 1
        assert [q.notification_id for q in k.quarantined()] == [nid]
        assert k.audit_log.verify_integrity() == k.audit_log.size()
