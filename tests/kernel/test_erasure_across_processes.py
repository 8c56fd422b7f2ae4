"""Keys a process cached before another process erased no longer open anything (both
backends, two real processes).

Found while testing decision 0052's crash retry: a process that had loaded a capture's key
kept handing it out after another process destroyed it and signed the receipt, because
key caches were flushed only in the erasing process. Now every key lookup, cached or not,
first asks the erasure ledger, which every process appends to before any key goes.
"""

from __future__ import annotations

from uuid import UUID

from audit.receipts import verify_receipt
from domain.profile import SubjectProfile
from tests.conftest import Backend
from tests.kernel.conftest import consent, say
from tests.kernel.other_process import receipt_from_another_process
from tests.kernel.test_erasure import CANARIES, fill_with_canaries
from uprof.kernel import Uprof


def opened_topics(kernel: Uprof, stream: str) -> list[str]:
    """Topics of the stream's events that this process can still open."""
    opened = []
    for stored in kernel.app.recorder.select_events(UUID(stream)):
        if stored.topic.endswith(("SubjectErased", "CaptureErased")):
            continue
        event = kernel.app.mapper.to_domain_event(stored)
        if not isinstance(event, SubjectProfile.ContentShredded):
            opened.append(stored.topic)
    return opened


def test_subject_keys_cached_here_are_gone_once_another_process_erases(
    backend: Backend, kernel: Uprof
) -> None:
    fill_with_canaries(kernel, "alice")
    stream = str(kernel.stream_of("alice"))
    # This process holds the subject's keys in its caches.
    assert kernel.keystore.key(stream, 1) is not None
    assert kernel.keystore.view_key(stream) is not None
    assert opened_topics(kernel, stream)

    receipt = receipt_from_another_process(backend, 'erase_subject("alice")')

    verify_receipt(receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    assert kernel.keystore.key(stream, 1) is None
    assert kernel.keystore.view_key(stream) is None
    assert opened_topics(kernel, stream) == []
    assert kernel.residue_scan([*CANARIES.values(), "alice"]).clean


def test_a_capture_key_cached_here_is_gone_once_another_process_erases_the_capture(
    backend: Backend, kernel: Uprof
) -> None:
    consent(kernel)
    ack = kernel.capture("alice", say("I want to learn to sail"))
    kept = kernel.capture("alice", say("I live in Porto"))
    kernel.process()
    stream = str(kernel.stream_of("alice"))
    assert kernel.keystore.capture_key(stream, ack.capture_id) is not None

    receipt = receipt_from_another_process(backend, f"erase_capture('alice', {ack.capture_id!r})")

    verify_receipt(receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
    assert kernel.keystore.capture_key(stream, ack.capture_id) is None
    assert kernel.keystore.capture_key(stream, kept.capture_id) is not None  # only that one
    assert "sail" not in str(kernel.profile("alice"))
