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

import json
import os
from pathlib import Path
from uuid import UUID

import pytest
from eventsourcing.utils import get_topic

from domain.errors import StoredDataDamagedError, SubjectErasedError
from domain.profile import SubjectProfile
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, consent, running, say, settings_for
from tests.kernel.stored_rows import flip_last_byte, rewrite_row, stored_rows
from uprof.crypto import mapper
from uprof.crypto.mapper import DamagedEventError
from uprof.kernel import Uprof
from uprof.services.backup import backup, restore
from uprof.services.late_captures import LateCaptures
from uprof.services.quarantine import MAX_DAMAGED_EVENTS

CANARY = "Qzxdamagedcanary"
BYSTANDER = "Qzxbystandercanary"


def damage(
    kernel: Uprof, stream: UUID, nth_capture: int = 0, topic: str = "InteractionCaptured"
) -> int:
    """Flip the last byte (inside the GCM tag) of one stored event of ``stream`` (the
    ``nth_capture``-th of ``topic``), in the stored row itself; return its notification
    id. Flipping it again repairs it."""
    version, topic_found, state = [r for r in stored_rows(kernel, stream) if topic in r[1]][
        nth_capture
    ]
    rewrite_row(kernel, stream, version, topic_found, flip_last_byte(state))
    app = kernel.app
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
        [entry] = [e.entry for e in k.audit_entries(action="capture.quarantined")]
        assert entry["event_ids"] == [f"event:{nid}"]
        assert entry["reason_code"] == "DamagedEventError"
        assert CANARY not in json.dumps(entry)
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


def test_erasing_the_damaged_subject_clears_its_quarantine(
    backend: Backend, clock: FakeClock
) -> None:
    """alice's later capture, written before the damage, cannot be applied (her stream
    does not load): it is set aside beside the damaged one (a new capture of hers is
    refused as a damaged read, BZ). Her erasure still completes (0119) and takes both
    entries out of the list; the residue scan finds nothing, bob is unchanged."""
    with running(settings_for(backend), clock) as k:
        consent(k, "alice")
        consent(k, "bob")
        k.process()
        k.capture_many("alice", [say(f"I met {CANARY} at the market", ref="a-1")])
        k.capture_many("bob", [say(f"I met {BYSTANDER} at the market", ref="b-1")])
        k.capture_many("alice", [say(f"I met {CANARY}2 at the park", ref="a-2")])
        damage(k, k.stream_of("alice"))
    with running(settings_for(backend), clock) as k:
        k.process()
        assert memories(k, "bob") == [f"I met {BYSTANDER} at the market"]
        stages = sorted(q.stage for q in k.quarantined())
        assert stages == ["damaged", "load"]
        [held] = [q for q in k.quarantined() if q.stage == "load"]
        assert k.retry_quarantined([held.capture_id])[0].outcome == "still-failing"
        [damaged] = [q for q in k.quarantined() if q.stage == "damaged"]
        assert k.retry_quarantined([damaged.capture_id])[0].outcome == "still-failing"
        bob = k.profile("bob")
        k.erase_subject("alice")
        assert k.quarantined() == []
        assert k.lag().quarantined == 0
        with pytest.raises(SubjectErasedError):
            k.profile("alice")
        assert k.residue_scan([CANARY, "alice"]).clean
        assert k.profile("bob") == bob
        k.capture_many("bob", [say("I met Qzxthirdcanary at the market", ref="b-3")])
        k.process()
        assert len(memories(k, "bob")) == 2
        assert k.audit_log.verify_integrity() == k.audit_log.size()
    with running(settings_for(backend), clock) as k:
        assert k.quarantined() == []


def test_rebuilt_views_equal_live_ones_past_a_damaged_event(
    backend: Backend, clock: FakeClock
) -> None:
    """The damaged capture is alice's anchored head row. A rebuild refuses before it drops
    anything (decision 0150, bug IS: a head row that is not the one committed may stand
    in for a narrowing event, which a rebuild must not pass over), so the views stay the
    live ones; erasing the damaged subject (0119) lets the rebuild run, and it rebuilds
    bob's views as they were."""
    _damaged_before_extraction(backend, clock)
    with running(settings_for(backend), clock) as k:
        k.process()
        live = memories(k, "bob")
        with pytest.raises(StoredDataDamagedError, match="rebuilding the views refused"):
            k.rebuild()
        assert memories(k, "bob") == live
        k.erase_subject("alice")
        k.rebuild()
        assert memories(k, "bob") == live


def test_a_wrong_key_folder_stops_the_pipeline_and_sets_nothing_aside(
    backend: Backend, clock: FakeClock
) -> None:
    """A KEK that is not the one the DEKs were wrapped under (another deployment's key
    folder) must not read as damage: the pipeline stops as before, nothing is recorded."""
    _damaged_before_extraction(backend, clock)
    with running(settings_for(backend), clock) as k:
        ring = k.keystore._ring  # type: ignore[attr-defined]
        ring.keys = {epoch: os.urandom(32) for epoch in ring.keys}
        ring.reload = lambda: None  # keep the foreign ring
        for subject in ("alice", "bob"):
            k.keystore.evict(str(k.stream_of(subject)))
        before = k.extraction.position
        with pytest.raises(Exception) as stopped:  # whatever the unwrap raises
            k.process()
        assert not isinstance(stopped.value, StoredDataDamagedError)
        assert k.extraction.position == before
        assert set_aside(k) == []


def test_many_events_failing_authentication_stop_the_pipeline(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug of ours that breaks every event's authentication (here: the associated data
    changed) looks like damage everywhere; past ``MAX_DAMAGED_EVENTS`` the pipeline stops
    instead of setting every capture aside."""
    with running(settings_for(backend), clock) as k:
        consent(k, "bob")
        k.process()
        for i in range(MAX_DAMAGED_EVENTS + 2):
            k.capture_many("bob", [say(f"I like green tea {i}", ref=f"b-{i}")])
    monkeypatch.setattr(mapper, "_aad", lambda *_a: b"not what was sealed")
    with running(settings_for(backend), clock) as k:
        before = k.extraction.position
        with pytest.raises(DamagedEventError):
            k.process()
        assert k.extraction.position == before
        assert set_aside(k) == []


def test_the_late_audit_check_of_another_process_passes_a_damaged_event(
    backend: Backend, clock: FakeClock
) -> None:
    """What one process extracted is checked against the audit log by the next one, read
    again from the log (decision 0112). Reading the damaged event there failed the check
    at every run (a warning and a back-off each time, the check position stuck), so no
    later lost request of the partition would be named."""
    _damaged_before_extraction(backend, clock)
    with running(settings_for(backend), clock) as k:
        k.process()  # extracted; its check waits for the grace (an hour by default)
    settings = settings_for(backend).model_copy(update={"late_capture_check_s": 0})
    with running(settings, clock) as k:
        late = k.extraction.late_captures
        assert isinstance(late, LateCaptures)
        k.process()
        k.process()
        assert late.failures == 0
        name = late.check_row(k.extraction.tracking_name(0))
        assert k.app.check_position(name) == k.extraction.position


def test_a_restore_from_before_the_damage_extracts_the_event(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The restore that repairs a damaged event is one of a backup taken before the
    damage, hence before its verdict: the restored log holds no verdict and its positions
    are before the event, so the pipeline extracts it as any other."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        consent(k, "alice")
        consent(k, "bob")
        k.process()
        k.capture_many("alice", [say(f"I met {CANARY} at the market", ref="a-1")])
        k.capture_many("bob", [say(f"I met {BYSTANDER} at the market", ref="b-1")])
    backup(settings, tmp_path / "bk")
    with running(settings, clock) as k:
        damage(k, k.stream_of("alice"))
        k.process()
        assert [q.stage for q in k.quarantined()] == ["damaged"]
    restore(settings, tmp_path / "bk")
    with running(settings, clock) as k:
        k.process()
        assert set_aside(k) == []
        assert k.quarantined() == []
        assert memories(k, "alice") == [f"I met {CANARY} at the market"]
        assert memories(k, "bob") == [f"I met {BYSTANDER} at the market"]


def test_a_row_repaired_in_place_is_not_retried_and_rebuild_equals_live(
    backend: Backend, clock: FakeClock
) -> None:
    """A damaged row repaired by hand keeps its verdict: the retry says ``not-retryable``
    (the restore of decision 0060 is the repair that re-extracts), and the projections,
    live or rebuilt, pass over it alike."""
    _damaged_before_extraction(backend, clock)
    with running(settings_for(backend), clock) as k:
        k.process()
        damage(k, k.stream_of("alice"))  # the same byte flipped back: the row opens again
    with running(settings_for(backend), clock) as k:
        [entry] = k.quarantined()
        assert k.retry_quarantined([entry.capture_id])[0].outcome == "not-retryable"
        k.process()
        live = (k.profile("alice"), k.profile("bob"))
        k.rebuild()
        assert (k.profile("alice"), k.profile("bob")) == live
        assert memories(k, "alice") == []


def test_a_verdict_whose_audit_entry_was_lost_gets_it_at_the_next_listing(
    backend: Backend, clock: FakeClock
) -> None:
    """As when the worker dies between its batch's commit and its audit append."""
    nid = _damaged_before_extraction(backend, clock)
    with running(settings_for(backend), clock) as k:
        k.extraction.on_quarantined = lambda _q: None  # the append never happens
        k.process()
        assert list(k.audit_entries(action="capture.quarantined")) == []
    with running(settings_for(backend), clock) as k:
        for _ in range(2):
            assert [q.capture_id for q in k.quarantined()] == [f"event:{nid}"]
        [entry] = [e.entry for e in k.audit_entries(action="capture.quarantined")]
        assert entry["event_ids"] == [f"event:{nid}"]


def _damaged_after_extraction(backend: Backend, clock: FakeClock) -> int:
    with running(settings_for(backend), clock) as k:
        consent(k, "alice")
        consent(k, "bob")
        k.capture_many("alice", [say(f"I met {CANARY} at the market", ref="a-1")])
        k.capture_many("bob", [say(f"I met {BYSTANDER} at the market", ref="b-1")])
        k.process()
        return damage(k, k.stream_of("alice"))


def test_a_rebuild_passes_an_event_damaged_after_its_extraction(
    backend: Backend, clock: FakeClock
) -> None:
    """An event damaged after it was extracted and projected has no verdict: a rebuild
    stopped there (``DamagedEventError``), leaving every later event of the partition
    unprojected, so bob's reads failed too (bug DC; run by hand on SQLite). The
    projection now records the verdict first and passes over it, once."""
    nid = _damaged_after_extraction(backend, clock)
    with running(settings_for(backend), clock) as k:
        k.capture_many("bob", [say("I met Qzxsecondcanary at the park", ref="b-2")])
        k.process()
        live_bob = k.profile("bob")
        k.rebuild()
        assert k.profile("bob") == live_bob
        assert [v.notification_id for v in set_aside(k)] == [nid]  # type: ignore[attr-defined]
        [entry] = k.quarantined()
        assert (entry.capture_id, entry.stage) == (f"event:{nid}", "damaged")
        k.rebuild()  # again: the verdict is there, nothing recorded twice
        assert k.profile("bob") == live_bob
        assert len(set_aside(k)) == 1
        k.erase_subject("alice")
        assert k.quarantined() == []
        assert k.residue_scan([CANARY, "alice"]).clean


def test_a_capture_the_projections_set_aside_first_gets_one_verdict(
    backend: Backend, clock: FakeClock
) -> None:
    """The projections may meet an unextracted damaged capture before the extraction
    worker does (separate loops): the worker finds their verdict and writes none."""
    nid = _damaged_before_extraction(backend, clock)
    with running(settings_for(backend), clock) as k:
        k.projections.run_until_idle()
        assert [v.notification_id for v in set_aside(k)] == [nid]  # type: ignore[attr-defined]
        k.process()
        assert memories(k, "bob") == [f"I met {BYSTANDER} at the market"]
        assert [v.notification_id for v in set_aside(k)] == [nid]  # type: ignore[attr-defined]
        assert [q.capture_id for q in k.quarantined()] == [f"event:{nid}"]
        assert len(list(k.audit_entries(action="capture.quarantined"))) == 1
