"""The kernel's storage contract, run on SQLite and on PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from domain.errors import ConsentRequiredError, EvidenceError, InvalidInputError
from domain.values import (
    INFERRED_CONFIDENCE_CAP,
    AttributeProposal,
    IntentProposal,
    IntentStatus,
    IntentUpdateProposal,
    ProposalBatch,
)
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, consent, say, settings_for
from uprof.kernel import Uprof
from uprof.services.residue import ResidueReport, scan_files
from uprof.storage import create_engine, layout_for


def test_capture_without_consent_is_refused_and_stores_nothing(kernel: Uprof) -> None:
    with pytest.raises(ConsentRequiredError):
        kernel.capture("alice", say("I live in Paris"))
    assert kernel.app.max_notification_id() == 0
    assert kernel.subjects.find("alice") is None


def test_capture_for_another_app_or_purpose_is_refused(kernel: Uprof) -> None:
    consent(kernel)
    position = kernel.app.max_notification_id()
    with pytest.raises(ConsentRequiredError):
        kernel.capture("alice", say("hello there", app="app:other"))
    with pytest.raises(ConsentRequiredError):
        kernel.capture("alice", say("hello there", purpose="advertising"))
    assert kernel.app.max_notification_id() == position


def test_batch_with_one_refused_interaction_writes_nothing(kernel: Uprof) -> None:
    consent(kernel)
    position = kernel.app.max_notification_id()
    with pytest.raises(ConsentRequiredError):
        kernel.capture_many("alice", [say("I live in Paris"), say("x", app="app:other")])
    assert kernel.app.max_notification_id() == position


def test_bad_input_names_the_field_and_writes_nothing(kernel: Uprof) -> None:
    consent(kernel)
    position = kernel.app.max_notification_id()
    with pytest.raises(InvalidInputError, match="app_id"):
        kernel.capture("alice", say("hello", app=" "))
    with pytest.raises(InvalidInputError, match="user_input or agent_response"):
        kernel.capture("alice", say("   "))
    assert kernel.app.max_notification_id() == position


def test_withdrawn_consent_blocks_the_next_capture(kernel: Uprof) -> None:
    consent_id = consent(kernel)
    kernel.capture("alice", say("I live in Paris"))
    kernel.withdraw_consent("alice", consent_id)
    with pytest.raises(ConsentRequiredError):
        kernel.capture("alice", say("I live in Rome"))


def test_expired_consent_blocks_capture(kernel: Uprof, clock: FakeClock) -> None:
    kernel.grant_consent(
        "alice",
        app_id=APP,
        categories=["*"],
        purposes=["personalization"],
        expires_at=clock.now() + timedelta(days=1),
    )
    kernel.capture("alice", say("hello"))
    clock.advance(days=2)
    with pytest.raises(ConsentRequiredError):
        kernel.capture("alice", say("hello again"))


def test_profile_has_three_layers_with_evidence(kernel: Uprof) -> None:
    consent(kernel)
    acks = kernel.capture_many(
        "alice", [say("I live in Paris", ref="D1:1"), say("I want to run a marathon", ref="D1:2")]
    )
    view = kernel.profile("alice")
    assert [(a.key, a.value) for a in view.attributes] == [("home_location", "Paris")]
    assert view.attributes[0].evidence == (acks[0].capture_id,)
    assert [i.description for i in view.intents] == ["run a marathon"]
    assert {m.source_refs for m in view.memories} == {("D1:1",), ("D1:2",)}
    assert all(m.evidence for m in view.memories)


def test_contradictions_are_kept_and_flagged(kernel: Uprof) -> None:
    consent(kernel)
    kernel.capture_many("alice", [say("I live in Paris"), say("I live in Lisbon")])
    attributes = kernel.profile("alice").attributes
    assert sorted(a.value for a in attributes) == ["Lisbon", "Paris"]
    assert {a.status for a in attributes} == {"conflicting"}
    by_value = {a.value: a for a in attributes}
    assert by_value["Paris"].item_id in by_value["Lisbon"].conflicts_with


def test_repeated_evidence_reinforces_instead_of_duplicating(kernel: Uprof) -> None:
    consent(kernel)
    kernel.capture_many("alice", [say("I live in Paris"), say("I live in Paris")])
    (attribute,) = kernel.profile("alice").attributes
    assert len(attribute.evidence) == 2
    assert attribute.confidence > 0.9


def test_category_without_consent_is_not_extracted(kernel: Uprof) -> None:
    consent(kernel, categories=("conversation",))
    kernel.capture("alice", say("I live in Paris"))
    view = kernel.profile("alice")
    assert view.attributes == ()  # location was not consented
    assert len(view.memories) == 1


def test_proposal_citing_missing_or_foreign_evidence_is_refused(kernel: Uprof) -> None:
    consent(kernel)
    consent(kernel, subject="bob")
    bob_ack = kernel.capture("bob", say("I live in Oslo"))
    kernel.capture("alice", say("hello"))
    missing = ProposalBatch(
        (AttributeProposal("occupation", "pilot", ("0" * 32,)),),
        author="agent",
        owner_agent="agent:one",
        app_id=APP,
    )
    with pytest.raises(EvidenceError, match="does not name"):
        kernel.submit_proposals("alice", missing)
    foreign = ProposalBatch(
        (AttributeProposal("occupation", "pilot", (bob_ack.capture_id,)),),
        author="agent",
        owner_agent="agent:one",
        app_id=APP,
    )
    with pytest.raises(EvidenceError, match="of this subject"):
        kernel.submit_proposals("alice", foreign)
    assert not any(a.key == "occupation" for a in kernel.profile("alice").attributes)


def test_proposal_without_evidence_is_inferred_with_capped_confidence(kernel: Uprof) -> None:
    consent(kernel)
    kernel.capture("alice", say("hello"))
    batch = ProposalBatch(
        (AttributeProposal("occupation", "pilot", (), confidence=0.99),),
        author="agent",
        owner_agent="agent:one",
        app_id=APP,
    )
    assert kernel.submit_proposals("alice", batch) == 1
    (attribute,) = [a for a in kernel.profile("alice").attributes if a.key == "occupation"]
    assert attribute.provenance == "inferred"
    assert attribute.confidence <= INFERRED_CONFIDENCE_CAP


def test_intent_lifecycle_from_agent_proposal(kernel: Uprof) -> None:
    consent(kernel)
    ack = kernel.capture("alice", say("I want to learn Spanish"))
    (intent,) = kernel.profile("alice").intents
    done = ProposalBatch(
        (
            IntentUpdateProposal(
                IntentStatus.FULFILLED, intent_id=intent.item_id, evidence=(ack.capture_id,)
            ),
        ),
        author="agent",
        owner_agent="agent:one",
        app_id=APP,
    )
    kernel.submit_proposals("alice", done)
    (intent,) = kernel.profile("alice").intents
    assert intent.status == "fulfilled"


def test_rebuild_equals_live(kernel: Uprof) -> None:
    consent(kernel)
    consent(kernel, subject="bob")
    for day in range(1, 8):
        kernel.capture("alice", say(f"I live in Paris and day {day} was fine", day=day))
        kernel.capture("bob", say("I want to climb a mountain", day=day))
    kernel.capture("alice", say("I live in Rome"))
    kernel.process()
    live = kernel.queries.table_digest()
    live_ids, live_vectors = kernel.queries.embedding_matrix()
    kernel.rebuild()
    assert kernel.queries.table_digest() == live
    rebuilt_ids, rebuilt_vectors = kernel.queries.embedding_matrix()
    assert rebuilt_ids == live_ids
    assert (abs(rebuilt_vectors - live_vectors) < 1e-6).all()


def _schema_lock_taken(engine: sa.Engine) -> bool:
    """Whether another holder has the store's schema lock, asked as a second process would
    (a connection or a file descriptor of its own), without waiting."""
    if engine.dialect.name == "postgresql":
        from uprof.backends.postgres import SCHEMA_LOCK_KEY

        with engine.connect() as conn:
            got = conn.execute(sa.select(sa.func.pg_try_advisory_lock(SCHEMA_LOCK_KEY))).scalar()
            if got:
                conn.execute(sa.select(sa.func.pg_advisory_unlock(SCHEMA_LOCK_KEY)))
            conn.commit()
        return not got
    import fcntl
    import os

    from uprof.backends.sqlite import SCHEMA_LOCK_SUFFIX

    fd = os.open(f"{engine.url.database}{SCHEMA_LOCK_SUFFIX}", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_rebuild_holds_the_lock_that_orders_rebuilds_and_first_starts(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes rebuilding one PostgreSQL store at once crashed one of them
    (UniqueViolation on pk_profile_subjects; reproduced in 2 of 12 processes): a rebuild
    now runs under the views store's schema lock, which another process's rebuild waits
    for. Checked from a second connection (file descriptor) while the replay runs."""
    consent(kernel)
    kernel.capture("alice", say("I live in Paris"))
    kernel.process()
    seen: list[bool] = []
    replay = kernel.projections.rebuild

    def watched(progress=None):  # type: ignore[no-untyped-def]
        seen.append(_schema_lock_taken(kernel.views_engine))
        return replay(progress)

    monkeypatch.setattr(kernel.projections, "rebuild", watched)
    assert not _schema_lock_taken(kernel.views_engine)

    kernel.rebuild()

    assert seen == [True]
    assert not _schema_lock_taken(kernel.views_engine)  # released once done


def test_projection_applies_each_event_once(kernel: Uprof) -> None:
    consent(kernel)
    kernel.capture("alice", say("I live in Paris"))
    kernel.process()
    before = kernel.queries.table_digest()
    # Replaying an old batch must change nothing: the position guards it.
    notifications = kernel.app.notifications_after(0, 100)
    events = [(n.id, kernel.app.decode(n)) for n in notifications]
    applied = kernel.queries.apply_batch(kernel.app.name, events, notifications[-1].id)
    assert applied == 0
    assert kernel.queries.table_digest() == before


def test_profile_as_of_shows_the_earlier_state(kernel: Uprof) -> None:
    consent(kernel)
    kernel.capture("alice", say("I live in Paris"))
    kernel.process()
    middle = kernel.app.repository.get(kernel.stream_of("alice")).modified_on
    kernel.capture("alice", say("I live in Rome"))
    then = kernel.profile("alice", as_of=middle)
    now = kernel.profile("alice")
    assert [a.value for a in then.attributes] == ["Paris"]
    assert sorted(a.value for a in now.attributes) == ["Paris", "Rome"]


def test_personal_data_is_encrypted_at_rest(kernel: Uprof, backend: Backend) -> None:
    consent(kernel)
    canary = "Zanzibarcanary"
    kernel.capture("alice", say(f"I live in {canary}"))
    layout = layout_for(settings_for(backend))
    if backend.kind == "sqlite":
        assert layout.events_path is not None
        # Raw bytes of the file and its WAL, read by the residue scan's child process:
        # reading them here would drop this process's locks on them (FIELD-NOTES 8.1).
        report = ResidueReport()
        scan_files(layout.events_path.parent, [canary, "alice"], report)
        assert report.files_scanned >= 2
        in_events = [f for f in report.findings if f.location.startswith(str(layout.events_path))]
        assert in_events == []
    else:
        engine = create_engine(backend.url)
        try:
            with engine.connect() as conn:
                states = conn.execute(sa.text("SELECT state FROM profiles_events")).scalars().all()
        finally:
            engine.dispose()
        assert states and all(canary.encode() not in bytes(s) for s in states)


def test_audit_records_refusals_without_content(kernel: Uprof) -> None:
    with pytest.raises(ConsentRequiredError):
        kernel.capture("alice", say("my secret canary text"))
    entries = [e.entry for e in kernel.audit.log.entries()]  # type: ignore[attr-defined]
    refused = [e for e in entries if e["action"] == "capture.refused"]
    assert len(refused) == 1
    assert "canary" not in repr(entries)
    assert "alice" not in repr(entries)


def test_decay_job_expires_intents_and_archives_the_coldest(
    kernel: Uprof, clock: FakeClock
) -> None:
    from uprof.services.maintenance import MaintenanceService

    consent(kernel)
    kernel.capture_many("alice", [say(f"note number {i}", day=1 + i) for i in range(5)])
    batch = ProposalBatch(
        (IntentProposal("renew the passport", (), expires_at=clock.now() + timedelta(days=1)),),
        author="agent",
        owner_agent="agent:one",
        app_id=APP,
    )
    kernel.submit_proposals("alice", batch)
    kernel.maintenance = MaintenanceService(kernel.app, kernel.subjects, kernel.queries, capacity=3)
    clock.advance(days=2)
    assert kernel.run_maintenance() == {
        "intents_expired": 1,
        "memories_archived": 2,
        "views_caught_up": 1,
    }
    view = kernel.profile("alice")
    assert [i.status for i in view.intents] == ["expired"]
    archived = sorted(m.text for m in view.memories if m.archived)
    assert archived == ["note number 0", "note number 1"]  # the oldest, never visited
