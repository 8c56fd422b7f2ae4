"""An erasure that answered ``erasure_incomplete`` is finished by asking again (both backends).

The keys go before the projections purge; when the purge does not finish within the
wait bound, the caller is told to ask again. Found by the erasure-under-load scenario:
asking again was refused as "this subject was erased", so the receipt was never issued.
"""

from __future__ import annotations

import io

import pytest
import sqlalchemy as sa

from audit.check import check_upload
from audit.receipts import verify_receipt, verify_subject_commitment
from domain.errors import ErasureIncompleteError, SubjectErasedError
from projections.profile import tables as t
from tests.conftest import Backend
from tests.kernel.conftest import consent, say
from tests.kernel.other_process import crash_at, receipt_from_another_process
from tests.kernel.test_erasure import CANARIES, fill_with_canaries
from uprof.kernel import Uprof


def projections_stay_behind(kernel: Uprof, monkeypatch: pytest.MonkeyPatch) -> None:
    """The projection workers do not pass the tombstone within the wait bound."""
    monkeypatch.setattr(kernel.erasure_service, "_catch_up", lambda position, timeout: False)


def unfinished_request(kernel: Uprof, subject: str) -> str:
    ledger = kernel.keystore.ledger
    assert ledger is not None
    record = ledger.unfinished(kernel.subjects.tenant, subject)
    assert record is not None, "the incomplete erasure left no record to finish it by"
    return record.request_id


def rows_left(kernel: Uprof, stream: str) -> int:
    with kernel.views_engine.connect() as conn:
        return sum(
            conn.execute(
                sa.select(sa.func.count()).select_from(table).where(table.c.stream_id == stream)
            ).scalar_one()
            for table in t.SUBJECT_TABLES
        )


def test_asking_again_finishes_the_erasure_and_issues_its_receipt(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill_with_canaries(kernel, "alice")
    stream = str(kernel.stream_of("alice"))
    with monkeypatch.context() as behind:
        projections_stay_behind(kernel, behind)
        with pytest.raises(ErasureIncompleteError, match="Ask again"):
            kernel.erase_subject("alice")
    request_id = unfinished_request(kernel, "alice")
    # The keys are gone already: the name is refused for everything but finishing.
    with pytest.raises(SubjectErasedError):
        kernel.profile("alice")

    result = kernel.erase_subject("alice")

    body = result.receipt["body"]
    assert body["request"]["request_id"] == request_id  # the same request, finished
    verify_receipt(result.receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    verify_subject_commitment(result.receipt, "alice", bytes.fromhex(result.subject_nonce_hex))
    types = [a["type"] for a in body["actions"]]
    assert types[0] == "tombstone_appended" and "dek_destroyed" in types
    assert result.counts["deks"] >= 1 and result.counts["rows_memories"] >= 1
    assert rows_left(kernel, stream) == 0
    assert kernel.residue_scan([*CANARIES.values(), "alice"]).clean
    # Finished once: the next request is refused like any erased name, and nothing is left
    # to finish.
    ledger = kernel.keystore.ledger
    assert ledger is not None and ledger.unfinished(kernel.subjects.tenant, "alice") is None
    with pytest.raises(SubjectErasedError):
        kernel.erase_subject("alice")


def test_a_finished_erasure_is_not_reopened_and_others_are_unaffected(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill_with_canaries(kernel, "alice")
    fill_with_canaries(kernel, "bob")
    kernel.erase_subject("bob")  # complete at once: no incomplete record
    with monkeypatch.context() as behind:
        projections_stay_behind(kernel, behind)
        with pytest.raises(ErasureIncompleteError):
            kernel.erase_subject("alice")
        # Still behind: asking again says so again, and the erasure stays unfinished.
        with pytest.raises(ErasureIncompleteError):
            kernel.erase_subject("alice")
    assert unfinished_request(kernel, "alice")
    with pytest.raises(SubjectErasedError):
        kernel.erase_subject("bob")
    kernel.erase_subject("alice")
    with pytest.raises(SubjectErasedError):
        kernel.erase_subject("alice")


def test_another_process_finishes_an_incomplete_erasure(
    backend: Backend, kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill_with_canaries(kernel, "alice")
    stream = str(kernel.stream_of("alice"))
    with monkeypatch.context() as behind:
        projections_stay_behind(kernel, behind)
        with pytest.raises(ErasureIncompleteError):
            kernel.erase_subject("alice")
    request_id = unfinished_request(kernel, "alice")
    receipt = receipt_from_another_process(backend, 'erase_subject("alice")')
    assert receipt["body"]["request"]["request_id"] == request_id
    verify_receipt(receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    assert rows_left(kernel, stream) == 0
    with pytest.raises(SubjectErasedError):
        kernel.erase_subject("alice")


def test_a_retry_after_a_crash_before_the_keys_went_gets_the_receipt(
    backend: Backend, kernel: Uprof
) -> None:
    """Killed between the ledger record and the key destruction: the name is refused from
    then on, and before decision 0052 the erasure never got a receipt. The retry reaches
    a process that was running before the crash (so no start re-applied the ledger): it
    destroys the keys itself before it signs."""
    fill_with_canaries(kernel, "alice")
    stream = str(kernel.stream_of("alice"))

    died = crash_at(backend, "destroy", 'erase_subject("alice")')

    assert died.returncode == 9, died.stderr[-3000:]
    request_id = unfinished_request(kernel, "alice")
    assert not kernel.keystore.is_shredded(stream)  # the bad moment: recorded, keys still there
    result = kernel.erase_subject("alice")
    assert result.receipt["body"]["request"]["request_id"] == request_id
    verify_receipt(result.receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    assert kernel.keystore.is_shredded(stream)
    assert kernel.keystore.key(stream, 1) is None
    assert rows_left(kernel, stream) == 0
    assert kernel.residue_scan([*CANARIES.values(), "alice"]).clean
    with pytest.raises(SubjectErasedError):
        kernel.erase_subject("alice")


def exported_trail_verifies(kernel: Uprof) -> bool:
    """The whole audit trail, exported, passes the offline verifier."""
    out = io.StringIO()
    kernel.export_audit(out)
    log = kernel.audit_log
    return bool(check_upload(out.getvalue().encode(), "export", log.public_key, log.origin).ok)


def test_a_subject_erasure_finished_after_a_crash_records_its_keys_once(
    backend: Backend, kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed between the ledger record and the key destruction, the subject erasure is
    finished by a retry in a process that was running: the subject keys'
    ``key.destroyed`` entries are written as the uninterrupted path writes them, one per
    key the receipt cites, however often the finish runs. Until 2026-12-05 the finish
    destroyed the keys and wrote no entry, so the log had no key destruction for a
    receipt citing one."""
    fill_with_canaries(kernel, "alice")
    died = crash_at(backend, "destroy", 'erase_subject("alice")')
    assert died.returncode == 9, died.stderr[-3000:]
    request_id = unfinished_request(kernel, "alice")
    with monkeypatch.context() as behind:
        projections_stay_behind(kernel, behind)
        with pytest.raises(ErasureIncompleteError):
            kernel.erase_subject("alice")
    result = kernel.erase_subject("alice")

    assert result.receipt["body"]["request"]["request_id"] == request_id
    cited = sorted(
        (a["key_version"], a["dek_commitment"])
        for a in result.receipt["body"]["actions"]
        if a["type"] == "dek_destroyed"
    )
    entries = [
        e.entry
        for e in kernel.audit_log.entries(action="key.destroyed")
        if e.entry.get("request_id") == request_id
    ]
    assert cited
    assert sorted((e["key_version"], e["dek_commitment"]) for e in entries) == cited
    assert exported_trail_verifies(kernel)


def test_a_retry_after_a_crash_mid_event_erasure_gets_the_receipt_after_a_restart(
    backend: Backend, kernel: Uprof
) -> None:
    fill_with_canaries(kernel, "alice")
    stream = str(kernel.stream_of("alice"))
    (capture,) = [c for c in kernel.queries.all_captures(stream) if c.source_ref == "ref-2"]

    died = crash_at(
        backend, "destroy_capture_key", f"erase_capture('alice', {capture.capture_id!r})"
    )

    assert died.returncode == 9, died.stderr[-3000:]
    ledger = kernel.keystore.ledger
    assert ledger is not None
    record = ledger.unfinished(
        kernel.subjects.tenant, "alice", scope="capture", target=[capture.capture_id]
    )
    assert record is not None
    # A restarted process: its start re-applies the ledger, and the retry finishes.
    receipt = receipt_from_another_process(
        backend, f"erase_capture('alice', {capture.capture_id!r})"
    )
    assert receipt["body"]["request"]["request_id"] == record.request_id
    verify_receipt(receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    assert kernel.keystore.capture_key_commitment(stream, capture.capture_id) is None
    assert capture.capture_id not in {c.capture_id for c in kernel.queries.all_captures(stream)}
    assert CANARIES["memory"] not in str(kernel.profile("alice"))


def test_a_retry_after_a_crash_past_the_tombstone_cites_the_tombstone(
    backend: Backend, kernel: Uprof
) -> None:
    """Killed after the tombstone and before the ledger record: the retry is a new request
    that finishes the cascade. Its receipt cites the stream's SubjectErased, not the log
    head (before decision 0053 it cited whatever event was newest)."""
    fill_with_canaries(kernel, "alice")
    stream = str(kernel.stream_of("alice"))

    died = crash_at(
        backend, "record_subject", 'erase_subject("alice")', owner="kernel.keystore.ledger"
    )

    assert died.returncode == 9, died.stderr[-3000:]
    fill_with_canaries(kernel, "bob")  # later events: the head is no longer the tombstone
    result = kernel.erase_subject("alice")
    verify_receipt(result.receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    (tombstone,) = [
        a for a in result.receipt["body"]["actions"] if a["type"] == "tombstone_appended"
    ]
    (cited,) = kernel.app.notifications_after(int(tombstone["notification_id"]) - 1, 1)
    assert cited.id == int(tombstone["notification_id"])
    assert str(cited.originator_id) == stream and cited.topic.endswith("SubjectErased")
    assert rows_left(kernel, stream) == 0


def test_a_retry_after_a_crash_before_an_item_erasure_was_written_gets_the_receipt(
    backend: Backend, kernel: Uprof
) -> None:
    """Killed between the item's ledger record and its erasure event: before decision
    0053 the retry found nothing recorded and, once the item was gone, answered not
    found with no receipt. Now it writes the erasure and signs the original request."""
    consent(kernel)
    kernel.capture("alice", say("I want to learn to sail"))
    (intent,) = kernel.profile("alice").intents

    died = crash_at(backend, "save", f"erase_item('alice', {intent.item_id!r})", owner="kernel.app")

    assert died.returncode == 9, died.stderr[-3000:]
    ledger = kernel.keystore.ledger
    assert ledger is not None
    record = ledger.unfinished(
        kernel.subjects.tenant, "alice", scope="item", target=[intent.item_id]
    )
    assert record is not None
    # Not served meanwhile (bug IP: it was, until a start or a retry).
    assert kernel.profile("alice").intents == ()
    result = kernel.erase_item("alice", intent.item_id)
    assert result.receipt["body"]["request"]["request_id"] == record.request_id
    verify_receipt(result.receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    assert kernel.profile("alice").intents == ()


def capture_key_destructions(kernel: Uprof, request_id: str) -> list[str]:
    """The commitments of the capture-key ``key.destroyed`` entries of one request."""
    return [
        str(e.entry["dek_commitment"])
        for e in kernel.audit_log.entries(action="key.destroyed")
        if e.entry.get("reason_code") == "capture-key" and e.entry.get("request_id") == request_id
    ]


def test_an_event_erasure_finished_after_a_crash_records_its_capture_key_once(
    backend: Backend, kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed between the ledger record and the capture key's destruction, the event
    erasure is finished by a retry in a process that was running (decision 0071): the
    capture key's ``key.destroyed`` entry is written as the uninterrupted path writes
    it, citing the receipt's commitment, and once, however often the finish runs.
    Until 2026-12-05 the finish destroyed the key and wrote no entry."""
    fill_with_canaries(kernel, "alice")
    stream = str(kernel.stream_of("alice"))
    (capture,) = [c for c in kernel.queries.all_captures(stream) if c.source_ref == "ref-2"]
    commitment = kernel.keystore.capture_key_commitment(stream, capture.capture_id)
    call = f"erase_capture('alice', {capture.capture_id!r})"

    died = crash_at(backend, "destroy_capture_key", call)

    assert died.returncode == 9, died.stderr[-3000:]
    ledger = kernel.keystore.ledger
    assert ledger is not None
    record = ledger.unfinished(
        kernel.subjects.tenant, "alice", scope="capture", target=[capture.capture_id]
    )
    assert record is not None
    assert capture_key_destructions(kernel, record.request_id) == []
    # The first finish does not see the purge in time (the entry is written all the same),
    # the second one does: two finishes, one entry.
    with monkeypatch.context() as behind:
        projections_stay_behind(kernel, behind)
        with pytest.raises(ErasureIncompleteError):
            kernel.erase_capture("alice", capture.capture_id)
    result = kernel.erase_capture("alice", capture.capture_id)

    assert result.receipt["body"]["request"]["request_id"] == record.request_id
    cited = [
        a["dek_commitment"]
        for a in result.receipt["body"]["actions"]
        if a["type"] == "dek_destroyed"
    ]
    assert cited == [commitment]
    assert capture_key_destructions(kernel, record.request_id) == [commitment]
    assert kernel.keystore.capture_key_commitment(stream, capture.capture_id) is None
    (entry,) = [
        e.entry
        for e in kernel.audit_log.entries(action="key.destroyed")
        if e.entry.get("request_id") == record.request_id
    ]
    assert entry["subject_ref"] == kernel.audit_subject_ref("alice")
    assert exported_trail_verifies(kernel)


def test_an_event_erasure_killed_after_its_entries_does_not_record_its_key_twice(
    backend: Backend, kernel: Uprof
) -> None:
    """Killed after the capture key's ``key.destroyed`` entry and before the receipt: the
    retry finishes the same request and writes no second entry for that key."""
    fill_with_canaries(kernel, "alice")
    stream = str(kernel.stream_of("alice"))
    (capture,) = [c for c in kernel.queries.all_captures(stream) if c.source_ref == "ref-2"]
    commitment = kernel.keystore.capture_key_commitment(stream, capture.capture_id)

    died = crash_at(
        backend,
        "drop_snapshots",
        f"erase_capture('alice', {capture.capture_id!r})",
        owner="kernel.app",
    )

    assert died.returncode == 9, died.stderr[-3000:]
    result = kernel.erase_capture("alice", capture.capture_id)
    request_id = result.receipt["body"]["request"]["request_id"]
    assert capture_key_destructions(kernel, request_id) == [commitment]
