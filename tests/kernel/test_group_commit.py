"""Group commit of captures (decision 0017): many requests, one set of commits, each
request all or nothing and answered with its own acks."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from uuid import uuid4

import pytest

from domain.errors import CaptureBackloggedError, ConsentRequiredError, SubjectErasedError
from tests.kernel.conftest import consent, say
from uprof.api.errors import classify
from uprof.eventstore import CAPTURED_TOPIC
from uprof.kernel import Uprof
from uprof.services.capture import check_interaction
from uprof.services.capture_writer import CaptureWriter, PendingCapture


@pytest.fixture
def writing(kernel: Uprof) -> Iterator[Uprof]:
    """The kernel with its capture writer running (as a front door starts it)."""
    writer = kernel.capture_service.writer
    writer.start()
    try:
        yield kernel
    finally:
        writer.stop()


def _log_captures(kernel: Uprof) -> Counter[str]:
    notes = kernel.app.notifications_after(0, 10_000, topics=[CAPTURED_TOPIC])
    return Counter(kernel.app.decode(n).capture_id for n in notes)


def _pending(kernel: Uprof, subject: str, *interactions, token: str | None = None):
    handle = kernel.subjects.find(subject)
    assert handle is not None
    return PendingCapture(
        stream_id=handle.stream_id,
        pseudonym=handle.pseudonym,
        interactions=[check_interaction(i) for i in interactions],
        batch_token=token,
        token_window_s=3600.0,
        principal=None,
    )


def test_concurrent_captures_are_grouped_and_each_in_the_log_once(writing: Uprof) -> None:
    kernel = writing
    subjects = ["alice", "bob", "carol"]
    for s in subjects:
        consent(kernel, s)
    acks, errors = [], []
    lock = threading.Lock()

    def client(c: int) -> None:
        for n in range(10):
            try:
                ack = kernel.capture(subjects[(c + n) % 3], say(f"I like tea number {c}x{n}"))
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)
                continue
            with lock:
                acks.append(ack)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert len(acks) == 80
    writer = kernel.capture_service.writer
    assert writer.grouped_requests >= 80
    assert writer.groups < writer.grouped_requests, "no two requests shared a group"
    in_log = _log_captures(kernel)
    assert all(in_log[a.capture_id] == 1 for a in acks)
    assert len(in_log) == 80
    assert len({a.notification_id for a in acks}) == 80
    # Each ack's position really holds its capture, and every stream's versions are gapless.
    for subject in subjects:
        stream = kernel.stream_of(subject)
        profile = kernel.app.load(stream)
        assert profile.capture_count == sum(
            1 for a in acks if a.subject_pseudonym == kernel.subjects.pseudonym(subject)
        )
        events = kernel.app.recorder.select_events(stream)
        assert [e.originator_version for e in events] == list(range(1, len(events) + 1))
    notes = {n.id: n for n in kernel.app.notifications_after(0, 10_000, [CAPTURED_TOPIC])}
    assert all(kernel.app.decode(notes[a.notification_id]).capture_id == a.capture_id for a in acks)
    accepted = kernel.audit_log.entries(action="capture.accepted")
    assert len(list(accepted)) == 80


def test_a_refused_request_writes_nothing_and_does_not_hold_up_its_group(kernel: Uprof) -> None:
    consent(kernel, "alice")
    consent(kernel, "bob", app="app:calendar")  # bob's consent names another app
    ok = _pending(kernel, "alice", say("I like green tea"))
    no_consent = _pending(kernel, "bob", say("I like black tea"))
    # One interaction for a purpose without consent refuses the whole request.
    half = _pending(kernel, "alice", say("I like oolong"), say("I buy tea", purpose="ads"))
    ok2 = _pending(kernel, "alice", say("I like jasmine"), say("I like sencha"))
    bob_before = kernel.app.load(kernel.stream_of("bob")).version
    kernel.capture_service.writer.commit([ok, no_consent, half, ok2])
    assert isinstance(no_consent.error, ConsentRequiredError)
    assert isinstance(half.error, ConsentRequiredError)
    assert no_consent.acks is None and half.acks is None
    assert ok.error is None and ok2.error is None
    assert len(ok.acks) == 1 and len(ok2.acks) == 2
    in_log = _log_captures(kernel)
    assert sorted(in_log) == sorted(c for c, _ in ok.acks + ok2.acks)
    assert kernel.app.load(kernel.stream_of("alice")).capture_count == 3
    assert kernel.app.load(kernel.stream_of("bob")).version == bob_before
    refused = list(kernel.audit_log.entries(action="capture.refused"))
    assert len(refused) == 2
    assert len(list(kernel.audit_log.entries(action="capture.accepted"))) == 2


def test_a_token_repeated_in_one_group_is_captured_once(kernel: Uprof) -> None:
    consent(kernel, "alice")
    first = _pending(kernel, "alice", say("I like green tea"), token="t-1")
    again = _pending(kernel, "alice", say("I like green tea"), token="t-1")
    kernel.capture_service.writer.commit([first, again])
    assert first.error is None and again.error is None
    assert again.replayed and not first.replayed
    assert again.acks == first.acks
    assert len(_log_captures(kernel)) == 1


def test_a_copy_behind_another_writer_is_brought_up_to_date(kernel: Uprof) -> None:
    """Another writer's events since the writer's last save are applied to its copy."""
    consent(kernel, "alice")
    writer = kernel.capture_service.writer
    first = _pending(kernel, "alice", say("I like green tea"))
    writer.commit([first])
    kernel.capture_service._save_one(
        first.stream_id,
        first.pseudonym,
        [check_interaction(say("I like coffee"))],
        batch_token=None,
        item_tokens=None,
        token_window_s=0.0,
    )
    second = _pending(kernel, "alice", say("I like mint"))
    writer.commit([second])
    assert second.error is None
    assert kernel.app.load(first.stream_id).capture_count == 3
    assert len(_log_captures(kernel)) == 3


def test_a_group_that_loses_the_version_check_is_retried(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write landing between the writer's catch-up and its save (another process)
    makes the save conflict; nothing of the lost attempt stays, the retry commits."""
    consent(kernel, "alice")
    service = kernel.capture_service
    real_save = kernel.app.save
    raced = []

    def save_after_a_rival(*aggregates):
        if not raced:
            raced.append(True)
            service._save_one(
                aggregates[0].id,
                "p",
                [check_interaction(say("I like coffee"))],
                batch_token=None,
                item_tokens=None,
                token_window_s=0.0,
            )
        return real_save(*aggregates)

    monkeypatch.setattr(kernel.app, "save", save_after_a_rival)
    pending = _pending(kernel, "alice", say("I like mint"))
    service.writer.commit([pending])
    assert raced and pending.error is None and len(pending.acks) == 1
    in_log = _log_captures(kernel)
    assert len(in_log) == 2 and in_log[pending.acks[0][0]] == 1
    assert kernel.app.load(pending.stream_id).capture_count == 2


def test_erasure_forgets_the_writers_copy(writing: Uprof) -> None:
    consent(writing, "alice")
    writing.capture("alice", say("I like green tea"))
    stream = writing.stream_of("alice")
    writer = writing.capture_service.writer
    assert stream in writer._saved
    writing.erase_subject("alice")
    assert stream not in writer._saved


def test_a_subject_erased_after_it_was_queued_fails_only_its_request(kernel: Uprof) -> None:
    consent(kernel, "alice")
    consent(kernel, "bob")
    ok = _pending(kernel, "alice", say("I like green tea"))
    gone = _pending(kernel, "bob", say("I like black tea"))
    kernel.erase_subject("bob")
    kernel.capture_service.writer.commit([gone, ok])
    assert isinstance(gone.error, SubjectErasedError) and gone.acks is None
    assert ok.error is None and len(ok.acks) == 1
    assert sorted(_log_captures(kernel)) == [ok.acks[0][0]]


def _own_writer(kernel: Uprof, **options: Any) -> CaptureWriter:
    """Give the kernel's capture service a writer built with ``options`` (not started)."""
    service = kernel.capture_service
    service.writer = CaptureWriter(
        kernel.app,
        kernel.keystore,
        kernel.clock,
        kernel.audit,
        kernel.subjects,
        service._write_alone,
        **options,
    )
    return service.writer


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _signal_commits(writer: CaptureWriter) -> threading.Event:
    """An Event set when the writer thread starts committing a group: the group is closed
    (no later request joins it) and the writer is about to wait for the streams' turn."""
    committing = threading.Event()
    commit = writer.commit

    def signalled(group: list[PendingCapture]) -> None:
        committing.set()
        commit(group)

    writer.commit = signalled  # type: ignore[method-assign]
    return committing


def test_a_full_queue_refuses_with_backlogged_and_stores_nothing_for_it(kernel: Uprof) -> None:
    consent(kernel, "alice")
    service = kernel.capture_service
    _own_writer(kernel, max_queued=1, enqueue_timeout_s=0.2)
    committing = _signal_commits(service.writer)
    service.writer.start()
    answers: dict[str, object] = {}

    def capture(name: str) -> None:
        try:
            answers[name] = kernel.capture("alice", say(f"I like tea {name}"))
        except Exception as e:
            answers[name] = e

    stream = kernel.stream_of("alice")
    writer_queue = service.writer._queue
    try:
        with kernel.app.writer_turns([stream]):  # the writer blocks on its first group
            first = threading.Thread(target=capture, args=("first",))
            first.start()
            # Until the writer has closed its first group (then blocks on the turn). Not a
            # poll of the queue plus a fixed sleep: a first request queued late (a busy
            # machine) joined the next one's group, the queue stayed empty and the wait
            # below never ended, the writer blocked on the turn this thread holds.
            assert committing.wait(60), "the writer never took the first request"
            queued = threading.Thread(target=capture, args=("queued",))
            queued.start()
            while writer_queue.unfinished_tasks < 2:  # counts every put (no task_done)
                time.sleep(0.01)
            capture("refused")  # the queue (1 slot) is full: refused after 0.2 s
        first.join(30)
        queued.join(30)
    finally:
        service.writer.stop()
    assert isinstance(answers["refused"], CaptureBackloggedError)
    assert classify(answers["refused"]) == (503, "capture_backlogged")
    stored = _log_captures(kernel)
    assert sorted(stored) == sorted([answers["first"].capture_id, answers["queued"].capture_id])


def test_stopping_answers_every_request_queued_or_arriving(kernel: Uprof) -> None:
    """A stop asked while requests wait in the queue behind a group in hand, and while
    clients go on sending: every request is answered and in the log once (the queued ones
    by the writer draining its queue, the later ones on their callers' threads).

    The moment is made, not waited for: the writer is held on its first group (the
    streams' turns), groups hold 2 requests, so the 6 clients' first requests are 2 in
    hand and 4 queued when the stop is asked."""
    consent(kernel, "alice")
    consent(kernel, "bob")
    writer = _own_writer(kernel, max_group=2)
    committing = _signal_commits(writer)
    writer.start()
    acks, errors = [], []

    def client(c: int) -> None:
        for n in range(6):
            try:
                acks.append(kernel.capture(("alice", "bob")[n % 2], say(f"I like {c}x{n}")))
            except Exception as e:
                errors.append(e)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(6)]
    stopping = threading.Thread(target=writer.stop)
    streams = [kernel.stream_of("alice"), kernel.stream_of("bob")]
    try:
        with kernel.app.writer_turns(streams):  # the writer blocks on its first group
            for t in threads:
                t.start()
            assert committing.wait(60), "the writer never took a request"
            # Counts every put (no task_done): each client's first request is in.
            _until(lambda: writer._queue.unfinished_tasks >= len(threads), "clients queued")
            assert writer._queue.qsize() >= 1, "no request waits in the queue"
            stopping.start()  # its drain waits for the turns held here
            _until(lambda: not writer.running, "the stop was never asked")
        for t in threads:
            t.join(60)
        stopping.join(60)
    finally:
        writer.stop()
    assert not any(t.is_alive() for t in threads), "a capture was left waiting"
    assert errors == []
    in_log = _log_captures(kernel)
    assert len(acks) == 36 and all(in_log[a.capture_id] == 1 for a in acks)


def _unresolved(subject_ref: str, *interactions) -> PendingCapture:
    """A request as the REST route queues it: the writer looks its subject up."""
    return PendingCapture(
        subject_ref=subject_ref,
        interactions=[check_interaction(i) for i in interactions],
        batch_token=None,
        token_window_s=3600.0,
        principal="app:planner/key-1",
    )


def test_the_writer_looks_up_a_groups_subjects_and_refuses_unknown_and_erased_alone(
    kernel: Uprof,
) -> None:
    consent(kernel, "alice")
    consent(kernel, "bob")
    kernel.erase_subject("bob")
    ok = _unresolved("alice", say("I like green tea"))
    ok2 = _unresolved("alice", say("I like mint"))
    unknown = _unresolved("nobody-at-all", say("I like black tea"))
    erased = _unresolved("bob", say("I like oolong"))
    refused_before = len(list(kernel.audit_log.entries(action="capture.refused")))
    kernel.capture_service.writer.commit([unknown, ok, erased, ok2])
    assert all(p.answered for p in (ok, ok2, unknown, erased))
    assert isinstance(unknown.error, ConsentRequiredError) and unknown.acks is None
    assert isinstance(erased.error, SubjectErasedError) and erased.acks is None
    assert classify(erased.error)[0] == 410
    assert ok.error is None and ok2.error is None
    assert ok.stream_id == kernel.stream_of("alice")
    assert ok.pseudonym == kernel.subjects.pseudonym("alice")
    assert sorted(_log_captures(kernel)) == sorted([ok.acks[0][0], ok2.acks[0][0]])
    refused = list(kernel.audit_log.entries(action="capture.refused"))[refused_before:]
    reasons = sorted(r.entry["reason_code"] for r in refused)
    assert reasons == ["no-consent-on-record", "subject-erased"]
    # As on the one-request path: one-off pseudonyms, linked to nothing; the principal named.
    assert {r.entry["subject_ref"] for r in refused} == {unknown.pseudonym, erased.pseudonym}
    assert unknown.pseudonym != erased.pseudonym
    assert all(r.entry["principal"] == "app:planner/key-1" for r in refused)


def test_coroutines_wait_for_the_writer_and_are_grouped(writing: Uprof) -> None:
    """The REST route's path: 16 coroutines on one event loop, no thread each."""
    import asyncio

    kernel = writing
    for s in ("alice", "bob"):
        consent(kernel, s)

    async def many() -> list:
        return await asyncio.gather(
            *(
                kernel.capture_async(("alice", "bob")[n % 2], [say(f"I like tea {n}")])
                for n in range(16)
            )
        )

    writer = kernel.capture_service.writer
    groups_before = writer.groups
    acks = [a for (a,) in asyncio.run(many())]
    assert len({a.capture_id for a in acks}) == 16
    assert writer.groups - groups_before < 16, "the coroutines were not grouped"
    in_log = _log_captures(kernel)
    assert all(in_log[a.capture_id] == 1 for a in acks)
    assert len(list(kernel.audit_log.entries(action="capture.accepted"))) == 16


def test_a_coroutine_is_served_on_a_thread_when_the_writer_is_not_running(
    kernel: Uprof,
) -> None:
    import asyncio

    consent(kernel, "alice")
    assert not kernel.capture_service.writer.running
    (ack,) = asyncio.run(kernel.capture_async("alice", [say("I like green tea")]))
    assert _log_captures(kernel)[ack.capture_id] == 1
    with pytest.raises(ConsentRequiredError):
        asyncio.run(kernel.capture_async("nobody-at-all", [say("I like tea")]))
    refused = list(kernel.audit_log.entries(action="capture.refused"))
    assert [r.entry["reason_code"] for r in refused] == ["no-consent-on-record"]


def test_catching_up_many_copies_matches_loading_them(kernel: Uprof) -> None:
    """Two queries for a group: a copy at the head stays, one behind gets the tail,
    a shredded one is refused; the stream versions are each stream's newest."""
    for s in ("alice", "bob", "carol"):
        consent(kernel, s)
    streams = {s: kernel.stream_of(s) for s in ("alice", "bob", "carol")}
    copies = {s: kernel.app.load(stream) for s, stream in streams.items()}
    bob_was = copies["bob"].version
    kernel.capture("bob", say("I like coffee"))  # bob's copy is now behind
    kernel.erase_subject("carol")
    caught_up = kernel.app.catch_up_many(list(copies.values()))
    assert caught_up[streams["alice"]] is copies["alice"]
    bob = caught_up[streams["bob"]]
    assert bob.version == kernel.app.load(streams["bob"]).version > bob_was
    assert bob.capture_count == 1
    assert isinstance(caught_up[streams["carol"]], SubjectErasedError)
    versions = kernel.app.stream_versions([streams["alice"], streams["bob"], uuid4()])
    assert versions == {
        streams["alice"]: copies["alice"].version,
        streams["bob"]: bob.version,
    }


def test_a_coroutine_finding_the_queue_full_is_refused_with_backlogged(kernel: Uprof) -> None:
    import asyncio

    consent(kernel, "alice")
    service = kernel.capture_service
    _own_writer(kernel, max_queued=1, enqueue_timeout_s=0.2)
    committing = _signal_commits(service.writer)
    service.writer.start()
    writer_queue = service.writer._queue
    turns = kernel.app.writer_turns([kernel.stream_of("alice")])

    async def scenario() -> tuple[list, list, BaseException | None]:
        # ``unfinished_tasks`` counts every put (the writer never calls task_done), so
        # the waits below cannot miss a request the writer takes at once.
        first = asyncio.create_task(kernel.capture_async("alice", [say("I like tea first")]))
        # Until the writer has closed the first group and waits for the turn (a fixed
        # 50 ms "past its linger" let, on a busy machine, the next request join it).
        while not committing.is_set():
            await asyncio.sleep(0.005)
        queued = asyncio.create_task(kernel.capture_async("alice", [say("I like tea queued")]))
        while writer_queue.unfinished_tasks < 2:
            await asyncio.sleep(0.005)  # queued behind the blocked writer: the queue is full
        refused: BaseException | None = None
        try:
            await asyncio.wait_for(
                kernel.capture_async("alice", [say("I like tea refused")]), timeout=10
            )
        except CaptureBackloggedError as error:
            refused = error
        turns.__exit__(None, None, None)  # the writer goes on
        return await first, await queued, refused

    turns.__enter__()
    try:
        first, queued, refused = asyncio.run(scenario())
    finally:
        service.writer.stop()
    assert isinstance(refused, CaptureBackloggedError)
    assert sorted(_log_captures(kernel)) == sorted([first[0].capture_id, queued[0].capture_id])
