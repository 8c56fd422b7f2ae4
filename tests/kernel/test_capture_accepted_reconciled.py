"""A capture request whose ``capture.accepted`` a crash kept off the log, never retried.

Decision 0090 recorded the lost entry when a keyed retry came; a request sent without an
idempotency key (or never retried) whose process died between the event store's commit
and the audit append stayed unrecorded for ever. The extraction worker, which reads
every captured event, now checks each batch's captures against the log and appends the
missing ``capture.accepted`` (``reason_code`` recorded-late, ``once_by`` its
``notification_id``): once, however many workers run and whether or not a keyed retry
races it; never for a subject erased since. Real processes killed with exit 9 after the
commit (both backends).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

from tests.children import PythonChild
from tests.conftest import OTHER_TENANT, Backend, seed_policy_for
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, say, settings_for
from tests.kernel.other_process import run_in_another_process
from tests.kernel.test_erasure_resume import exported_trail_verifies
from uprof.eventstore import CAPTURED_TOPIC
from uprof.kernel import Uprof
from uprof.services.late_captures import LateCaptures

CHILD_TIMEOUT_S = 180
LATE = "recorded-late"
TEXTS = ("I drink green tea", "I live in Lyon", "I play the oboe")


def accepted(kernel: Uprof) -> list[dict[str, Any]]:
    return [e.entry for e in kernel.audit_log.entries() if e.entry["action"] == "capture.accepted"]


def killed_after_commit(backend: Backend, texts: tuple[str, ...], token: str | None = None) -> None:
    """A real process killed (exit 9) after its capture committed, at its audit append."""
    died = run_in_another_process(
        backend,
        f"""
        from tests.kernel.conftest import say
        trail = kernel.capture_service._audit
        trail.record_many = lambda *args, **kwargs: os._exit(9)  # after the commit
        kernel.capture_many("alice", [say(t) for t in {list(texts)!r}],
                            request_token={token!r})
        """,
    )
    assert died.returncode == 9, died.stderr[-3000:]


def captured_positions(kernel: Uprof) -> list[int]:
    return [
        n.id
        for n in kernel.app.notifications_after(0, 1000)
        if n.topic.endswith("InteractionCaptured")
    ]


def worker(backend: Backend, batch_size: int = 256) -> PythonChild:
    """A real extraction worker process on the test's stores."""
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from tests.conftest import Backend
        from tests.fakes.ports import FakeClock
        from tests.kernel.conftest import build_kernel, settings_for

        backend = Backend({backend.kind!r}, {backend.url!r}, Path({str(backend.data_dir)!r}))
        # No grace: the test's capture processes are dead before the worker starts.
        settings = settings_for(backend).model_copy(
            update={{"projection_batch_size": {batch_size}, "late_capture_check_s": 0}}
        )
        kernel = build_kernel(settings, FakeClock())
        try:
            kernel.extraction.run_until_idle()
        finally:
            kernel.close()
        """
    )
    return PythonChild(script)


def run_workers(*children: PythonChild) -> None:
    for child in children:
        _, err = child.communicate(CHILD_TIMEOUT_S)
        assert child.returncode == 0, err[-3000:]


def no_captured_text(kernel: Uprof) -> bool:
    trail = json.dumps([e.entry for e in kernel.audit_log.entries()])
    return not any(t in trail or t.split()[-1] in trail for t in TEXTS)


def test_a_worker_records_the_lost_capture_accepted_of_an_unkeyed_request(
    backend: Backend, kernel: Uprof
) -> None:
    consent(kernel, "alice")
    killed_after_commit(backend, TEXTS[:2])
    assert accepted(kernel) == []  # stored captures, no entry (the defect)
    positions = captured_positions(kernel)
    assert len(positions) == 2

    run_workers(worker(backend))

    (entry,) = accepted(kernel)
    assert entry["reason_code"] == LATE
    assert entry["notification_id"] == max(positions)
    assert entry["counts"] == {"events": 2}
    assert entry["subject_ref"] == kernel.keystore.pseudonym_of_stream(
        str(kernel.subjects.find("alice").stream_id)
    )
    assert (entry["app_id"], entry["purpose"]) == ("app:planner", "personalization")
    assert entry["tenant"] == kernel.settings.tenant
    assert "principal" not in entry  # the pipeline's, not a caller's
    assert no_captured_text(kernel)
    assert exported_trail_verifies(kernel)


def test_two_workers_record_it_once(backend: Backend, kernel: Uprof) -> None:
    consent(kernel, "alice")
    killed_after_commit(backend, TEXTS[:2])
    run_workers(worker(backend, batch_size=1), worker(backend, batch_size=1))
    (entry,) = accepted(kernel)
    assert (entry["reason_code"], entry["counts"]) == (LATE, {"events": 2})
    assert exported_trail_verifies(kernel)


def checked_alone(kernel: Uprof, n: Any) -> None:
    """One capture checked as a batch of one by a worker of its own (its own position,
    started just before the capture): the checks of two workers in any order."""
    late = LateCaptures(
        kernel.app,
        kernel.audit_log,
        kernel.audit,
        kernel.keystore.subjects_of_streams,
        grace_s=0,
    )
    position = f"test-worker-{n.id}"
    late.follow(position, lambda _stream: True)
    late.begin(position, n.id - 1)
    late.extracted([(n, kernel.app.decode(n))], n.id, extraction=position, start=n.id - 1)


def test_the_batch_holding_the_requests_end_checked_first_names_it_whole(
    backend: Backend, kernel: Uprof
) -> None:
    """The race of two workers with batches of one, made deterministic: the batch holding
    the lost request's second capture is checked before the batch holding its first (one
    worker committed and checked first). Its run starts at its batch's start: it is
    followed back over the request's earlier captures, so both checks name the same
    whole request and the entry counts both events."""
    consent(kernel, "alice")
    killed_after_commit(backend, TEXTS[:2])
    first, second = kernel.app.notifications_after(0, 1000, topics=(CAPTURED_TOPIC,))
    assert (second.id, second.originator_version) == (first.id + 1, first.originator_version + 1)
    checked_alone(kernel, second)
    checked_alone(kernel, first)
    (entry,) = accepted(kernel)
    assert (entry["reason_code"], entry["counts"]) == (LATE, {"events": 2})
    assert entry["notification_id"] == second.id
    assert exported_trail_verifies(kernel)


def test_the_look_back_stops_at_the_request_before_on_the_log(
    backend: Backend, kernel: Uprof
) -> None:
    """The request before a lost one, at the previous ids and versions of the stream, is
    on the log: the look-back stops at it, whichever batch is checked first."""
    consent(kernel, "alice")
    kernel.capture_many("alice", [say("first request")])  # recorded as usual
    killed_after_commit(backend, TEXTS[:2])
    recorded, first, second = kernel.app.notifications_after(0, 1000, topics=(CAPTURED_TOPIC,))
    assert (second.id, first.id) == (first.id + 1, recorded.id + 1)  # one run of positions
    for n in (second, first, recorded):
        checked_alone(kernel, n)
    entries = accepted(kernel)
    assert [e.get("reason_code") for e in entries] == [None, LATE]
    assert (entries[1]["counts"], entries[1]["notification_id"]) == ({"events": 2}, second.id)


def test_a_request_across_two_batches_is_recorded_once_with_all_its_events(
    backend: Backend, kernel: Uprof
) -> None:
    consent(kernel, "alice")
    kernel.capture_many("alice", [say("first request")])  # recorded as usual
    killed_after_commit(backend, TEXTS)
    run_workers(worker(backend, batch_size=2))
    entries = accepted(kernel)
    assert [e.get("reason_code") for e in entries] == [None, LATE]
    assert entries[1]["counts"] == {"events": 3}
    assert entries[1]["notification_id"] == max(captured_positions(kernel))


def test_captures_on_the_log_add_nothing(backend: Backend, kernel: Uprof) -> None:
    """The common path: every request of the batch is on the log; a worker appends nothing,
    with requests cut across batches too."""
    consent(kernel, "alice")
    consent(kernel, "bob")
    kernel.capture_many("alice", [say(t) for t in TEXTS])
    kernel.capture_many("bob", [say(t) for t in TEXTS[:2]])
    kernel.capture_many("alice", [say("one more")])
    before = accepted(kernel)
    run_workers(worker(backend, batch_size=2))
    assert accepted(kernel) == before, [e.entry["action"] for e in kernel.audit_log.entries()]


def test_a_keyed_retry_after_the_worker_adds_nothing_and_the_worker_after_a_retry_neither(
    backend: Backend, kernel: Uprof
) -> None:
    consent(kernel, "alice")
    first = kernel.request_token("app:planner", "k1")
    killed_after_commit(backend, TEXTS[:2], first)
    run_workers(worker(backend))
    acks = kernel.capture_many("alice", [say(t) for t in TEXTS[:2]], request_token=first)
    (entry,) = accepted(kernel)
    assert entry["notification_id"] == max(a.notification_id for a in acks)

    second = kernel.request_token("app:planner", "k2")
    killed_after_commit(backend, TEXTS[2:], second)
    kernel.capture_many("alice", [say(TEXTS[2])], request_token=second)  # the retry first
    run_workers(worker(backend))
    assert [e["reason_code"] for e in accepted(kernel)] == [LATE, LATE]
    assert exported_trail_verifies(kernel)


def test_workers_and_keyed_retries_racing_record_it_once(backend: Backend, kernel: Uprof) -> None:
    consent(kernel, "alice")
    token = kernel.request_token("app:planner", "k1")
    killed_after_commit(backend, TEXTS[:2], token)
    retry = textwrap.dedent(
        f"""
        from pathlib import Path
        from tests.conftest import Backend
        from tests.fakes.ports import FakeClock
        from tests.kernel.conftest import build_kernel, say, settings_for

        backend = Backend({backend.kind!r}, {backend.url!r}, Path({str(backend.data_dir)!r}))
        kernel = build_kernel(settings_for(backend), FakeClock())
        try:
            for _ in range(3):
                kernel.capture_many("alice", [say(t) for t in {list(TEXTS[:2])!r}],
                                    request_token={token!r})
        finally:
            kernel.close()
        """
    )
    run_workers(worker(backend), PythonChild(retry), worker(backend), PythonChild(retry))
    (entry,) = accepted(kernel)
    assert entry["reason_code"] == LATE
    assert exported_trail_verifies(kernel)


def test_nothing_is_recorded_for_a_subject_erased_since(backend: Backend, kernel: Uprof) -> None:
    consent(kernel, "alice")
    killed_after_commit(backend, TEXTS[:2])
    kernel.erase_subject("alice")
    size = kernel.audit_log.size()
    run_workers(worker(backend))
    assert accepted(kernel) == []
    assert kernel.audit_log.size() == size
    assert exported_trail_verifies(kernel)


def test_the_entry_names_the_captures_tenant(
    backend: Backend, kernel: Uprof, clock: FakeClock, tmp_path: Path
) -> None:
    """Tenants on one set of stores share the event log, and a worker extracts every
    tenant's captures: the late entry names the subject's tenant, not the worker's."""
    policy = seed_policy_for(OTHER_TENANT, tmp_path)
    there = settings_for(backend).model_copy(update={"tenant": OTHER_TENANT, "policy_path": policy})
    other = build_kernel(there, clock)
    try:
        consent(other, "alice")
        pseudonym = other.keystore.pseudonym_of_stream(str(other.subjects.find("alice").stream_id))
    finally:
        other.close()
    died = PythonChild(
        textwrap.dedent(
            f"""
            import os
            from pathlib import Path
            from tests.conftest import Backend
            from tests.fakes.ports import FakeClock
            from tests.kernel.conftest import build_kernel, say, settings_for

            backend = Backend({backend.kind!r}, {backend.url!r}, Path({str(backend.data_dir)!r}))
            settings = settings_for(backend).model_copy(
                update={{"tenant": {OTHER_TENANT!r}, "policy_path": Path({str(policy)!r})}}
            )
            kernel = build_kernel(settings, FakeClock())
            kernel.capture_service._audit.record_many = lambda *a, **k: os._exit(9)
            kernel.capture_many("alice", [say("I drink green tea")])
            """
        )
    )
    died.communicate(CHILD_TIMEOUT_S)
    assert died.returncode == 9
    run_workers(worker(backend))  # the default tenant's worker
    (entry,) = accepted(kernel)  # the log is shared
    assert (entry["tenant"], entry["subject_ref"]) == (OTHER_TENANT, pseudonym)
    assert entry["reason_code"] == LATE
    assert exported_trail_verifies(kernel)


def test_a_batch_younger_than_the_grace_waits(backend: Backend, kernel: Uprof) -> None:
    """A live process appends its own entry a moment after its commit: a worker running
    in that moment must not write a late one too. With the default grace (60 s), the
    in-process worker right after the crash checks nothing yet."""
    consent(kernel, "alice")
    killed_after_commit(backend, TEXTS[:1])
    kernel.extraction.run_until_idle()
    assert accepted(kernel) == []
    assert kernel.extraction._late is not None and kernel.extraction._late.waiting == 1
