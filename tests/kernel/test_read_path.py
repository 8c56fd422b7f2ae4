"""The read path's shortcuts keep the promises (SQLite and PostgreSQL).

A slice waits only for its own subject's writes (I7), serves from a per-subject
view cached under the subject's newest write, reuses recent subject lookups, and
hands its record to a recorder. Each shortcut is checked against the writer it
could miss: another subject, another process (a second kernel on the same store),
an erasure, a recorder that cannot write.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from domain.errors import ReadRecordingError, SubjectErasedError, SubjectNotFoundError
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, build_kernel, consent, say, settings_for
from uprof.kernel import Uprof
from uprof.retry import RetryPolicy
from uprof.services.reads import ReadRecorder, ServedRead


def read(kernel: Uprof, query: str, subject: str = "alice", **kw):
    return kernel.slice(
        subject,
        query,
        budget_tokens=512,
        purpose="personalization",
        app_id=APP,
        agent_id="agent:one",
        **kw,
    )


@pytest.fixture
def second(backend: Backend, clock: FakeClock) -> Iterator[Uprof]:
    """Another deployment process on the same stores (its own caches and recorder)."""
    k = build_kernel(settings_for(backend), clock)
    try:
        yield k
    finally:
        k.close()


def test_a_read_does_not_wait_for_other_subjects_writes(kernel: Uprof) -> None:
    consent(kernel)
    consent(kernel, subject="bob")
    kernel.capture("alice", say("I want to adopt a greyhound"))
    read(kernel, "greyhound")
    kernel.capture("bob", say("I want to learn the cello"))
    before = kernel.projections.position
    result = read(kernel, "greyhound")
    assert result.fresh and "greyhound" in result.text
    assert kernel.projections.position == before  # bob's capture was left for later
    assert "cello" in read(kernel, "cello", subject="bob").text


def test_a_read_that_cannot_catch_up_says_so_and_is_not_cached(
    backend: Backend, clock: FakeClock
) -> None:
    settings = settings_for(backend).model_copy(update={"background_workers": True})
    k = build_kernel(settings, clock)
    try:
        consent(k)
        k.process()
        k.capture("alice", say("I want to adopt a greyhound"))
        stale = read(k, "greyhound", wait_timeout_s=0.05)  # no workers are running
        assert not stale.fresh and "greyhound" not in stale.text
        k.process()
        assert "greyhound" in read(k, "greyhound", wait_timeout_s=1.0).text
    finally:
        k.close()


def test_writes_from_another_process_reach_the_next_read(kernel: Uprof, second: Uprof) -> None:
    grant = consent(kernel)
    kernel.capture("alice", say("I want to adopt a greyhound"))
    assert "greyhound" in read(kernel, "greyhound").text  # caches alice's view here
    # Not "I live in Porto": the planner may not read location, and since decision 0016
    # neither the attribute nor the memory saying it reaches its slice.
    second.capture("alice", say("I want to learn the cello"))
    second.process()
    assert "cello" in read(kernel, "cello").text
    second.consent_service.withdraw("alice", grant)
    # The app holds no consent of alice any more: answered as for an unknown subject.
    with pytest.raises(SubjectNotFoundError):
        read(kernel, "greyhound")


def test_an_erasure_elsewhere_is_seen_by_a_reader_holding_the_subject(
    kernel: Uprof, second: Uprof
) -> None:
    consent(kernel)
    kernel.capture("alice", say("I want to adopt a greyhound"))
    assert read(kernel, "greyhound").items  # the lookup of "alice" is now cached
    second.erase_subject("alice")
    with pytest.raises(SubjectErasedError):
        read(kernel, "greyhound")
    # The name stays refused until an operator re-creates it (issue 13); then it is a new
    # subject, and the reader finds it, not the old one.
    with pytest.raises(SubjectErasedError):
        consent(second)
    second.recreate_subject("alice")
    consent(second)
    second.capture("alice", say("I want to learn the cello"))
    second.process()
    fresh = read(kernel, "cello greyhound")
    assert "cello" in fresh.text and "greyhound" not in fresh.text


def test_every_served_read_is_recorded_once_drained(kernel: Uprof) -> None:
    consent(kernel)
    kernel.capture("alice", say("I want to adopt a greyhound"))
    served = [read(kernel, "greyhound") for _ in range(25)]
    kernel.reads.drain()
    entries = list(kernel.audit_log.entries(action="slice.served"))
    assert len(entries) == 25
    assert sorted(entries[-1].entry["item_refs"]) == sorted(i.item_id for i in served[-1].items)
    stream = kernel.app.load(kernel.stream_of("alice"))
    assert sum(1 for _ in kernel.app.repository.event_store.get(stream.id)) >= 25
    kernel.process()
    visits = {m.item_id: m.visits for m in kernel.profile("alice").memories}
    assert max(visits.values()) == 25


def test_reads_served_before_an_erasure_are_recorded_before_it(kernel: Uprof) -> None:
    consent(kernel)
    kernel.capture("alice", say("I want to adopt a greyhound"))
    for _ in range(5):
        read(kernel, "greyhound")
    result = kernel.erase_subject("alice")
    entries = [e.entry["action"] for e in kernel.audit_log.entries()]
    last_read = max(i for i, a in enumerate(entries) if a == "slice.served")
    first_erasure = min(i for i, a in enumerate(entries) if a.startswith("erasure"))
    assert entries.count("slice.served") == 5 and last_read < first_erasure
    assert result.receipt


class _BrokenTrail:
    def record(self, action: str, **fields: object) -> None:
        raise OSError("audit store unavailable")

    def record_many(self, entries: object) -> None:
        raise OSError("audit store unavailable")


def _served(kernel: Uprof) -> ServedRead:
    handle = kernel.subjects.find("alice")
    assert handle is not None
    return ServedRead(
        stream_id=handle.stream_id,
        pseudonym=handle.pseudonym,
        app_id=APP,
        agent_id="agent:one",
        purpose="personalization",
        item_ids=(),
        served_at=kernel.clock.now(),
        budget_tokens=10,
        n_tokens=0,
    )


def test_a_recorder_that_cannot_write_refuses_further_reads(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    consent(kernel)
    kernel.capture("alice", say("I want to adopt a greyhound"))
    kernel.process()
    monkeypatch.setattr("uprof.retry.READ_RECORDING", RetryPolicy(attempts=1, on=(Exception,)))
    broken = ReadRecorder(kernel.app, _BrokenTrail(), mode="async", linger_s=0.0)
    broken.record(_served(kernel))
    with pytest.raises(ReadRecordingError):
        broken.drain(timeout_s=5)
    with pytest.raises(ReadRecordingError):
        broken.record(_served(kernel))
    assert not broken.healthy
    sync = ReadRecorder(kernel.app, _BrokenTrail(), mode="sync")
    with pytest.raises(OSError):
        sync.record(_served(kernel))  # the slice fails with it: nothing served unrecorded


class _SlowTrail:
    """An audit store that takes until ``release`` is set to accept a write."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.writing = threading.Event()  # set once the recorder is inside a write
        self.written = 0

    def record(self, action: str, **fields: object) -> None:
        self.record_many([(action, dict(fields))])

    def record_many(self, entries: list) -> None:
        self.writing.set()
        self.release.wait(timeout=10)
        self.written += len(entries)


def test_a_full_backlog_refuses_the_read(kernel: Uprof) -> None:
    consent(kernel)
    kernel.capture("alice", say("I want to adopt a greyhound"))
    kernel.process()
    trail = _SlowTrail()
    recorder = ReadRecorder(
        kernel.app, trail, mode="async", max_pending=1, linger_s=0.0, put_timeout_s=0.05
    )
    try:
        recorder.record(_served(kernel))
        # Until the recorder holds the first read in its (blocked) write.
        assert trail.writing.wait(timeout=10)
        recorder.record(_served(kernel))  # fills the one place
        with pytest.raises(ReadRecordingError, match="backed up"):
            recorder.record(_served(kernel))
    finally:
        trail.release.set()
        recorder.close()
    assert trail.written == 2 and recorder.healthy


def test_a_drain_ends_while_reads_keep_coming(kernel: Uprof) -> None:
    """A drain waits for the reads queued before it, not for an empty queue: under a
    steady stream of reads (a server's) the queue is never empty, and the pipeline worker
    drains before every run (the erasure-under-load run on PostgreSQL caught this)."""
    consent(kernel)
    kernel.capture("alice", say("I want to adopt a greyhound"))
    kernel.process()
    recorder = ReadRecorder(kernel.app, kernel.audit, mode="async", linger_s=0.05)
    stop = threading.Event()
    streaming = threading.Event()  # set once reads are arriving steadily

    def keep_reading() -> None:
        sent = 0
        while not stop.is_set():
            recorder.record(_served(kernel))
            sent += 1
            if sent == 50:
                streaming.set()
            time.sleep(0.0005)  # a server's pace, not a synchronisation

    producer = threading.Thread(target=keep_reading)
    producer.start()
    try:
        assert streaming.wait(timeout=30)
        before = recorder._queued
        # A drain that waited for an empty queue would never end here: it would raise
        # ReadRecordingError at its deadline instead of returning.
        recorder.drain(timeout_s=20)
        assert recorder.recorded >= before
        assert producer.is_alive()  # the stream was still flowing when the drain ended
    finally:
        stop.set()
        producer.join()
        recorder.close()
    assert recorder.pending == 0


def test_bad_recording_mode_is_refused(kernel: Uprof) -> None:
    with pytest.raises(ValueError, match="sync"):
        ReadRecorder(kernel.app, kernel.audit, mode="later")


def test_unknown_subject_is_not_found_even_with_lookups_cached(kernel: Uprof) -> None:
    with pytest.raises(SubjectNotFoundError):
        read(kernel, "anything", subject="nobody")
