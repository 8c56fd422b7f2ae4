"""Erasure of a subject whose stored ciphertext is damaged (erasure attacks, round 3).

A byte flipped in one stored encrypted event (disk damage, a bad copy, an edit) makes that
event fail authentication. The subject must still be erasable: the right to erasure does
not depend on the data being readable, and erasing is what makes the damaged event read
as shredded again (its key is gone). Both backends.
"""

from __future__ import annotations

from uuid import UUID

import pytest
from eventsourcing.persistence import MapperDeserialisationError

from audit.receipts import verify_receipt
from domain.errors import StoredDataDamagedError, SubjectErasedError
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, consent, running, say, settings_for
from tests.kernel.stored_rows import flip_last_byte, rewrite_row, stored_rows
from uprof.api.errors import classify
from uprof.kernel import Uprof

CANARY = "Qzxdamagedcanary"
BYSTANDER = "Qzxbystandercanary"


def _flip_one_byte(kernel: Uprof, stream: UUID, topic_part: str) -> None:
    """Flip the last byte (inside the GCM tag) of one stored event of ``stream``."""
    version, topic, state = next(r for r in stored_rows(kernel, stream) if topic_part in r[1])
    rewrite_row(kernel, stream, version, topic, flip_last_byte(state))


def _damaged_subject(backend: Backend, clock: FakeClock) -> None:
    with running(settings_for(backend), clock) as k:
        consent(k, "alice")
        consent(k, "bob")
        k.capture_many("alice", [say(f"I met {CANARY} at the market", ref="a-1")])
        k.capture_many("bob", [say(f"I met {BYSTANDER} at the market", ref="b-1")])
        k.process()
        _flip_one_byte(k, k.stream_of("alice"), "InteractionCaptured")


def test_a_subject_with_a_damaged_event_can_still_be_erased(
    backend: Backend, clock: FakeClock
) -> None:
    _damaged_subject(backend, clock)
    # A new process: nothing of alice is cached, every read goes to the stored bytes.
    with running(settings_for(backend), clock) as k:
        bob_before = k.profile("bob")
        result = k.erase_subject("alice")
        verify_receipt(result.receipt, k.audit_log.public_key, origin=k.audit_log.origin)
        assert k.residue_scan([CANARY, "alice"]).clean
        with pytest.raises(SubjectErasedError):
            k.profile("alice")
        assert k.profile("bob") == bob_before
        assert k.audit_log.verify_integrity() == k.audit_log.size()
    # And the next start agrees: the stream is shredded, nothing of alice opens.
    with running(settings_for(backend), clock) as k:
        with pytest.raises(SubjectErasedError):
            k.profile("alice")
        assert k.profile("bob") == bob_before


def test_erasing_a_damaged_unextracted_capture_frees_the_partition(
    backend: Backend, clock: FakeClock
) -> None:
    """The damaged event is not extracted yet (it used to stop its partition; it is now
    set aside, decision 0124-damaged-events-quarantined). Erasing alice must still
    complete, and afterwards the damaged event reads as shredded (its key is gone): bob's
    capture is extracted and served."""
    with running(settings_for(backend), clock) as k:
        consent(k, "alice")
        consent(k, "bob")
        k.process()
        k.capture_many("alice", [say(f"I met {CANARY} at the market", ref="a-1")])
        k.capture_many("bob", [say(f"I met {BYSTANDER} at the market", ref="b-1")])
        _flip_one_byte(k, k.stream_of("alice"), "InteractionCaptured")
    with running(settings_for(backend), clock) as k:
        # Set aside since decision 0124-damaged-events-quarantined (it stopped the
        # partition before): the erasure must complete all the same.
        k.process()
        result = k.erase_subject("alice")
        verify_receipt(result.receipt, k.audit_log.public_key, origin=k.audit_log.origin)
        k.process()
        assert [m.text for m in k.profile("bob").memories] == [f"I met {BYSTANDER} at the market"]
        assert k.residue_scan([CANARY, "alice"]).clean
        assert k.audit_log.verify_integrity() == k.audit_log.size()


def test_a_read_of_a_damaged_event_fails_closed_with_a_named_error(
    backend: Backend, clock: FakeClock
) -> None:
    """A slice reads the subject's stream (consents): the damaged event must refuse it with
    an error every surface names (REST 500 ``stored_data_damaged``), not the anonymous
    ``internal`` of an unexpected exception, and the message holds no stream id or
    content. The pipeline still sees the library's decoding error (bug BZ)."""
    _damaged_subject(backend, clock)
    with running(settings_for(backend), clock) as k:
        stream = str(k.stream_of("alice"))
        with pytest.raises(StoredDataDamagedError) as refused:
            k.slice(
                "alice",
                "market",
                budget_tokens=200,
                purpose="personalization",
                app_id=APP,
                agent_id="agent:one",
            )
        assert isinstance(refused.value, MapperDeserialisationError)
        assert classify(refused.value) == (500, "stored_data_damaged")
        message = str(refused.value)
        assert stream not in message and CANARY not in message
        assert k.profile("bob").memories  # the other subject is served as before
