"""Erasure, receipts and residue on SQLite and PostgreSQL (I8, I9, I10, I11)."""

from __future__ import annotations

import copy
import shutil
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

from audit.errors import VerificationError
from audit.receipts import verify_receipt, verify_subject_commitment
from domain.errors import ConsentRequiredError, SubjectErasedError, SubjectNotFoundError
from domain.profile import SubjectProfile
from projections.profile import tables as t
from projections.profile.queries import ProfileQueries
from tests.conftest import Backend
from tests.kernel.conftest import APP, consent, say
from uprof.kernel import Uprof

CANARIES = {
    "capture": "Qzxcapturecanary",
    "attribute": "Qzxlivecanary",
    "memory": "Qzxmemorycanary",
    "intent": "qzxintentcanary",
}


def fill_with_canaries(kernel: Uprof, subject: str) -> None:
    consent(kernel, subject=subject)
    kernel.capture_many(
        subject,
        [
            say(f"I live in {CANARIES['attribute']}", ref="ref-1"),
            say(f"Yesterday I met {CANARIES['memory']} at the market", ref="ref-2"),
            say(f"I want to {CANARIES['intent']} next spring", ref="ref-3"),
            say(f"note {CANARIES['capture']}", ref="ref-4"),
        ],
    )
    kernel.process()


def test_erasure_leaves_no_residue_and_verifies(kernel: Uprof) -> None:
    fill_with_canaries(kernel, "alice")
    stream = kernel.stream_of("alice")
    # Before: the scanner does see decryptable data is *not* yet shredded, and terms are sealed.
    result = kernel.erase_subject("alice")
    report = kernel.residue_scan([*CANARIES.values(), "alice"])
    assert report.clean, report.findings
    assert report.streams_checked == 1 and report.events_checked > 0
    verify_receipt(result.receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    verify_subject_commitment(result.receipt, "alice", bytes.fromhex(result.subject_nonce_hex))
    with kernel.views_engine.connect() as conn:
        for table in t.SUBJECT_TABLES:
            n = conn.execute(
                sa.select(sa.func.count())
                .select_from(table)
                .where(table.c.stream_id == str(stream))
            ).scalar_one()
            assert n == 0, table.name
    for stored in kernel.app.recorder.select_events(stream):
        event = kernel.app.mapper.to_domain_event(stored)
        assert isinstance(event, SubjectProfile.ContentShredded | SubjectProfile.SubjectErased)


def test_residue_scan_reports_a_planted_leak_by_location(kernel: Uprof) -> None:
    fill_with_canaries(kernel, "alice")
    kernel.erase_subject("alice")
    leak = kernel.settings.data_dir / "exports" / "oops.txt"
    leak.parent.mkdir(parents=True, exist_ok=True)
    leak.write_text(f"left behind: {CANARIES['memory']}")
    report = kernel.residue_scan([CANARIES["memory"]])
    assert not report.clean
    assert any("oops.txt@13" in f.location for f in report.findings)


def test_receipt_fails_after_any_single_byte_change(kernel: Uprof) -> None:
    fill_with_canaries(kernel, "alice")
    receipt = kernel.erase_subject("alice").receipt
    public_key = kernel.audit_log.public_key
    tampered = copy.deepcopy(receipt)
    tampered["body"]["actions"][0]["notification_id"] += 1
    with pytest.raises(VerificationError):
        verify_receipt(tampered, public_key, origin=kernel.audit_log.origin)
    tampered = copy.deepcopy(receipt)
    tampered["checkpoint"] = tampered["checkpoint"].replace("\n", " \n", 1)
    with pytest.raises(VerificationError):
        verify_receipt(tampered, public_key, origin=kernel.audit_log.origin)


def test_backup_taken_before_erasure_yields_nothing_readable(
    kernel: Uprof, backend: Backend
) -> None:
    fill_with_canaries(kernel, "alice")
    stream = str(kernel.stream_of("alice"))
    with kernel.views_engine.connect() as conn:
        backup_rows = conn.execute(
            sa.select(t.memories).where(t.memories.c.stream_id == stream)
        ).all()
    files_backup = backend.data_dir / "backup"
    if backend.kind == "sqlite":
        copy_without_keys(kernel.settings.data_dir, files_backup)
    assert backup_rows
    kernel.erase_subject("alice")
    # The backed-up rows are ciphertext whose key no longer exists.
    sealer = kernel.queries._sealer
    for row in backup_rows:
        assert sealer.open(stream, f"memories.text|{row.item_id}", row.text) is None
        assert all(c.encode() not in row.text for c in CANARIES.values())
    if backend.kind == "sqlite":
        from uprof.services.residue import ResidueReport, scan_files

        report = ResidueReport()
        scan_files(files_backup, list(CANARIES.values()), report)
        assert report.clean, report.findings
        restored = sa.create_engine(f"sqlite:///{files_backup / 'views.sqlite'}")
        try:
            view = ProfileQueries(restored, sealer).memories(stream)[0]
            assert view and all(m.text == "" for m in view)
        finally:
            restored.dispose()


def copy_without_keys(data_dir: Path, dest: Path) -> None:
    """Copy a live data folder, keys left out, the databases through the driver.

    A plain copy would open and close the live SQLite files in this process, which
    holds connections to them, and drop their locks (FIELD-NOTES 8.1).
    """
    dest.mkdir(parents=True)
    for path in sorted(data_dir.iterdir()):
        if path.name.startswith("keys.sqlite") or path.name == "keks.json":
            continue
        if path.name.endswith((".sqlite-wal", ".sqlite-shm", ".sqlite-journal")):
            continue  # the backup below copies what they hold
        if path.suffix == ".sqlite":
            source, target = sqlite3.connect(path), sqlite3.connect(dest / path.name)
            try:
                source.backup(target)
            finally:
                target.close()
                source.close()
        elif path.is_file():
            shutil.copy2(path, dest / path.name)


def test_other_subjects_are_untouched(kernel: Uprof) -> None:
    fill_with_canaries(kernel, "alice")
    consent(kernel, subject="bob")
    kernel.capture_many("bob", [say("I live in Oslo"), say("I want to learn to sail")])
    kernel.process()
    bob = str(kernel.stream_of("bob"))
    before = kernel.queries.table_digest([bob])
    kernel.erase_subject("alice")
    assert kernel.queries.table_digest([bob]) == before
    assert [a.value for a in kernel.profile("bob").attributes] == ["Oslo"]


def test_erased_subject_refuses_reads_and_writes(kernel: Uprof) -> None:
    fill_with_canaries(kernel, "alice")
    kernel.erase_subject("alice")
    with pytest.raises(SubjectErasedError):
        kernel.capture("alice", say("hello again"))
    with pytest.raises(SubjectErasedError):
        kernel.profile("alice")
    with pytest.raises(SubjectErasedError):
        kernel.erase_subject("alice")
    with pytest.raises(SubjectNotFoundError):
        kernel.profile("nobody")


def test_rebuild_after_erasures_equals_live(kernel: Uprof) -> None:
    fill_with_canaries(kernel, "alice")
    consent(kernel, subject="bob")
    acks = kernel.capture_many(
        "bob", [say("I live in Oslo"), say("I live in Oslo again"), say("I want to learn to sail")]
    )
    kernel.erase_subject("alice")
    kernel.erase_capture("bob", acks[2].capture_id)
    kernel.process()
    live = kernel.queries.table_digest()
    kernel.rebuild()
    assert kernel.queries.table_digest() == live


def test_erasing_one_event_keeps_attributes_backed_by_other_evidence(kernel: Uprof) -> None:
    consent(kernel)
    acks = kernel.capture_many(
        "alice",
        [
            say("I live in Porto", ref="a"),
            say("I live in Porto", ref="b"),
            say("I want to learn to sail", ref="c"),
        ],
    )
    (before,) = kernel.profile("alice").attributes
    result = kernel.erase_capture("alice", acks[0].capture_id)
    verify_receipt(result.receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    view = kernel.profile("alice")
    (after,) = view.attributes
    assert after.item_id == before.item_id and after.value == "Porto"
    assert after.evidence == (acks[1].capture_id,)
    assert after.confidence < before.confidence
    assert {m.source_refs for m in view.memories} == {("b",), ("c",)}
    # The erased event itself no longer opens.
    events = [
        kernel.app.mapper.to_domain_event(s)
        for s in kernel.app.recorder.select_events(kernel.stream_of("alice"))
    ]
    shredded = [e for e in events if isinstance(e, SubjectProfile.ContentShredded)]
    assert any(e.topic.endswith("InteractionCaptured") for e in shredded)


def test_erasing_the_only_evidence_removes_the_item(kernel: Uprof) -> None:
    consent(kernel)
    ack = kernel.capture("alice", say("I want to learn to sail"))
    kernel.erase_capture("alice", ack.capture_id)
    view = kernel.profile("alice")
    assert view.intents == () and view.memories == ()


def test_withdrawal_with_erase_blocks_capture_and_leaves_no_residue(kernel: Uprof) -> None:
    consent_id = consent(kernel)
    kernel.grant_consent("alice", app_id="app:calendar", categories=["*"], purposes=["scheduling"])
    kernel.capture("alice", say(f"I want to {CANARIES['intent']} soon"))
    kernel.capture("alice", say("Every Monday I swim", app="app:calendar", purpose="scheduling"))
    result = kernel.withdraw_consent("alice", consent_id, erase=True)
    assert result is not None
    verify_receipt(result.receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    with pytest.raises(ConsentRequiredError):
        kernel.capture("alice", say("more"))
    report = kernel.residue_scan([CANARIES["intent"]])
    assert report.clean, report.findings
    assert [m.text for m in kernel.profile("alice").memories] == ["Every Monday I swim"]


def test_erasing_an_item_purges_it_and_reports(kernel: Uprof) -> None:
    consent(kernel)
    kernel.capture("alice", say("I want to learn to sail"))
    (intent,) = kernel.profile("alice").intents
    result = kernel.erase_item("alice", intent.item_id)
    verify_receipt(result.receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    assert kernel.profile("alice").intents == ()
    assert len(kernel.profile("alice").memories) == 1


def test_capture_by_other_app_is_refused_after_withdrawal(kernel: Uprof) -> None:
    consent_id = consent(kernel)
    kernel.withdraw_consent("alice", consent_id)
    with pytest.raises(ConsentRequiredError):
        kernel.capture("alice", say("x", app=APP))


def test_erasure_drops_snapshots_of_long_streams(kernel: Uprof) -> None:
    consent(kernel)
    kernel.capture_many("alice", [say(f"entry {i} about {CANARIES['memory']}") for i in range(130)])
    kernel.process()
    stream = kernel.stream_of("alice")
    assert kernel.app.snapshots is not None
    assert kernel.app.snapshots.recorder.select_events(stream)  # the history was snapshotted
    kernel.erase_subject("alice")
    assert not kernel.app.snapshots.recorder.select_events(stream)
    report = kernel.residue_scan([CANARIES["memory"]])
    assert report.clean, report.findings


def test_kek_rotation_keeps_data_readable_and_retires_old_wrappings(kernel: Uprof) -> None:
    from cryptography.hazmat.primitives.keywrap import InvalidUnwrap, aes_key_unwrap

    from uprof.crypto.tables import subject_keys

    consent(kernel)
    kernel.capture("alice", say(f"I live in {CANARIES['attribute']}"))
    kernel.process()
    with kernel.keys_engine.connect() as conn:
        old_rows = conn.execute(sa.select(subject_keys)).all()  # a key-store "backup"
    outcome = kernel.keystore.rotate_kek()
    assert outcome["deks_rewrapped"] == len(old_rows) and outcome["epochs_forgotten"] == 1
    kernel.keystore.evict(str(kernel.stream_of("alice")))
    assert [a.value for a in kernel.profile("alice").attributes] == [CANARIES["attribute"]]
    ring = kernel.keystore._ring
    for row in old_rows:
        for kek in ring.keys.values():
            with pytest.raises(InvalidUnwrap):
                aes_key_unwrap(kek, row.wrapped_dek)
