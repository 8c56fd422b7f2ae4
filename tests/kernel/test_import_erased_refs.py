"""An import never brings back a capture erased at the subject's request (I9), however late.

Bug IC: a re-import skipped an erased capture's record only while the subject's stream
still held the record's retry token (the idempotency retention, 24 h by default): the
captures view, which matches ``source_ref``, loses the erased capture with the rest of its
derived data. A day later the same file (an old export, a nightly sync) captured the
erased words again, reported as a plain new capture. Fixed: the erasure keeps the keyed
token of the capture's (app, source_ref) in the subject's sealed stream, with no expiry
(decision 0147-erased-refs-stay-erased).
"""

from __future__ import annotations

from domain.profile import SubjectProfile
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, consent, say
from tests.kernel.test_idempotency import CAPTURED_TOPIC
from tests.kernel.test_import_idempotency import record
from uprof.kernel import Uprof
from uprof.services.importer import import_interactions


def captured(kernel: Uprof) -> list[str]:
    """Ids of every capture in the log that is not shredded (read from the log)."""
    notes = kernel.app.notifications_after(0, 100_000, [CAPTURED_TOPIC])
    events = [kernel.app.decode(n) for n in notes]
    return [e.capture_id for e in events if isinstance(e, SubjectProfile.InteractionCaptured)]


def test_an_erased_capture_stays_erased_after_the_retention_window(
    kernel: Uprof, clock: FakeClock
) -> None:
    consent(kernel)
    lines = [record("I like tea", ref="r-1"), record("I live in Porto", ref="r-2")]
    assert import_interactions(kernel, lines).captured == 2
    kernel.ensure_fresh(10)
    erased = next(c for c in captured(kernel))
    kernel.erase_capture("alice", erased)
    clock.advance(seconds=kernel.settings.idempotency_retention_s + 3600)
    kernel.ensure_fresh(10)
    dry = import_interactions(kernel, lines, dry_run=True)
    assert (dry.captured, dry.skipped, dry.erased) == (0, 2, ("line 1",)), dry
    again = import_interactions(kernel, lines)
    assert (again.captured, again.skipped, again.erased) == (0, 2, ("line 1",)), again
    assert len(captured(kernel)) == 1
    # Beyond any retention: the stream keeps the ref's token for the subject's life.
    clock.advance(seconds=400 * 86400)
    kernel.purge_idempotency_keys()
    assert import_interactions(kernel, lines[:1]).erased == ("line 1",)
    assert len(captured(kernel)) == 1


def test_a_capture_erased_by_a_withdrawal_stays_erased(kernel: Uprof, clock: FakeClock) -> None:
    consent_id = consent(kernel)
    lines = [record("I like tea", ref="r-1")]
    assert import_interactions(kernel, lines).captured == 1
    kernel.ensure_fresh(10)
    kernel.withdraw_consent("alice", consent_id, erase=True)
    consent(kernel)
    clock.advance(seconds=kernel.settings.idempotency_retention_s + 3600)
    kernel.ensure_fresh(10)
    again = import_interactions(kernel, lines)
    assert (again.captured, again.erased) == (0, ("line 1",)), again
    assert captured(kernel) == []


def test_the_save_skips_an_erased_ref_the_check_did_not_see(kernel: Uprof) -> None:
    """The stream decides at the capture's save too (an erasure between an import's check
    and its write, another process): the record is skipped and named, also when its token
    is its idempotency key's."""
    consent(kernel)
    assert import_interactions(kernel, [record("I like tea", ref="r-1")]).captured == 1
    kernel.ensure_fresh(10)
    kernel.erase_capture("alice", captured(kernel)[0])
    for token in (
        kernel.request_token(APP, "r-1", namespace="source_ref"),
        kernel.request_token(APP, "a-key"),
    ):
        outcome = kernel.capture_once("alice", [say("I like tea", ref="r-1")], item_tokens=[token])
        assert (outcome.acks, outcome.skipped, outcome.erased) == ([], 1, (0,))


def test_a_live_capture_with_an_erased_ref_is_captured(kernel: Uprof) -> None:
    """Decision: only imports are skipped. The user may say the same thing again through
    the app, with the app's same ref; a live capture carries no import token."""
    consent(kernel)
    assert import_interactions(kernel, [record("I like tea", ref="r-1")]).captured == 1
    kernel.ensure_fresh(10)
    kernel.erase_capture("alice", captured(kernel)[0])
    kernel.capture("alice", say("I like tea", ref="r-1"))
    assert len(captured(kernel)) == 1


def test_the_erased_refs_go_with_the_subject_and_leave_no_residue(kernel: Uprof) -> None:
    consent(kernel)
    assert import_interactions(kernel, [record("I like tea", ref="r-1")]).captured == 1
    kernel.ensure_fresh(10)
    kernel.erase_capture("alice", captured(kernel)[0])
    token = kernel.request_token(APP, "r-1", namespace="source_ref")
    stream = kernel.stream_of("alice")
    assert kernel.app.load(stream).ref_erased(token)
    kernel.erase_subject("alice")
    report = kernel.residue_scan([token, "r-1", "I like tea"])
    assert report.clean, report.findings
    for stored in kernel.app.recorder.select_events(stream):
        assert token.encode() not in stored.state
        event = kernel.app.mapper.to_domain_event(stored)
        assert not isinstance(event, SubjectProfile.ErasedRefsNoted)


def test_an_erased_subject_is_not_brought_back_by_a_reimport(
    kernel: Uprof, clock: FakeClock
) -> None:
    """Held: the whole subject erased, its file imported again (a day later too): every
    record fails naming the subject, nothing is captured, no new subject is created."""
    consent(kernel)
    lines = [record("I like tea", ref="r-1"), record("no ref at all")]
    assert import_interactions(kernel, lines).captured == 2
    kernel.erase_subject("alice")
    clock.advance(seconds=kernel.settings.idempotency_retention_s + 3600)
    again = import_interactions(kernel, lines)
    assert again.captured == 0 and again.subjects == 0, again
    assert [(p.field, p.message) for p in again.failed] == [
        ("subject", "its subject was erased")
    ] * 2
