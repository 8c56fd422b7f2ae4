"""A capture request whose ``capture.accepted`` a crash kept off the log (both backends).

A capture commits its events and keys, then appends ``capture.accepted`` (decision
0072). A process killed between the two left stored captures the audit log never
records; the client's keyed retry found the request recorded (its idempotency token),
got the acks and wrote nothing. Now the retry appends the first write's entry with
``reason_code`` recorded-late, only when the log does not hold it (``once_by`` its
``notification_id``), once however many retries or processes answer it.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from domain.errors import StoreBusyError
from tests.children import PythonChild
from tests.conftest import Backend
from tests.kernel.conftest import consent, say
from tests.kernel.other_process import run_in_another_process
from tests.kernel.test_erasure_resume import exported_trail_verifies
from uprof.kernel import Uprof

CHILD_TIMEOUT_S = 120
LATE = "recorded-late"


def accepted(kernel: Uprof) -> list[dict[str, Any]]:
    return [e.entry for e in kernel.audit_log.entries() if e.entry["action"] == "capture.accepted"]


def killed_after_commit(backend: Backend, token: str) -> None:
    """A real process killed (exit 9) after its capture committed, at its audit append."""
    died = run_in_another_process(
        backend,
        f"""
        from tests.kernel.conftest import say
        trail = kernel.capture_service._audit
        trail.record_many = lambda *args, **kwargs: os._exit(9)  # after the commit
        kernel.capture_many("alice", [say("I drink green tea"), say("I live in Lyon")],
                            request_token={token!r})
        """,
    )
    assert died.returncode == 9, died.stderr[-3000:]


def test_a_keyed_retry_after_a_crash_records_the_lost_capture_accepted_once(
    backend: Backend, kernel: Uprof
) -> None:
    consent(kernel, "alice")
    token = kernel.request_token("app:planner", "k1")
    killed_after_commit(backend, token)
    assert accepted(kernel) == []  # stored captures, no entry (the defect)

    batch = [say("I drink green tea"), say("I live in Lyon")]
    acks = kernel.capture_many("alice", batch, request_token=token)
    again = kernel.capture_many("alice", batch, request_token=token)
    assert again == acks

    (entry,) = accepted(kernel)
    assert entry["reason_code"] == LATE
    assert entry["notification_id"] == max(a.notification_id for a in acks)
    assert entry["counts"] == {"events": 2}
    assert entry["subject_ref"] == acks[0].subject_pseudonym
    assert entry["app_id"] == "app:planner"
    assert exported_trail_verifies(kernel)


def test_a_retry_of_a_recorded_request_writes_nothing_more(kernel: Uprof) -> None:
    consent(kernel, "alice")
    token = kernel.request_token("app:planner", "k1")
    first = kernel.capture_many("alice", [say("I drink green tea")], request_token=token)
    (entry,) = accepted(kernel)
    size = kernel.audit_log.size()
    assert kernel.capture_many("alice", [say("I drink green tea")], request_token=token) == first
    assert kernel.audit_log.size() == size
    assert "reason_code" not in entry


def test_the_group_commit_writer_answers_a_retry_the_same_way(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's path: the audit append fails once after the commit (in process)."""
    consent(kernel, "alice")
    service = kernel.capture_service
    trail = service._audit
    record_many = trail.record_many

    def dies_at_capture_accepted(entries: Any, **kwargs: Any) -> None:
        if any(action == "capture.accepted" for action, _ in entries):
            monkeypatch.setattr(trail, "record_many", record_many)
            raise StoreBusyError("the process is killed here")  # events and keys committed
        record_many(entries, **kwargs)

    monkeypatch.setattr(trail, "record_many", dies_at_capture_accepted)
    service.writer.start()
    try:
        token = kernel.request_token("app:planner", "k1")
        with pytest.raises(StoreBusyError):
            kernel.capture_many("alice", [say("I drink green tea")], request_token=token)
        assert accepted(kernel) == []
        (ack,) = kernel.capture_many("alice", [say("I drink green tea")], request_token=token)
        kernel.capture_many("alice", [say("I drink green tea")], request_token=token)
    finally:
        service.writer.stop()
    (entry,) = accepted(kernel)
    assert (entry["reason_code"], entry["notification_id"]) == (LATE, ack.notification_id)
    assert exported_trail_verifies(kernel)


def retrier(backend: Backend, token: str) -> PythonChild:
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from tests.conftest import Backend
        from tests.fakes.ports import FakeClock
        from tests.kernel.conftest import build_kernel, say, settings_for

        backend = Backend({backend.kind!r}, {backend.url!r}, Path({str(backend.data_dir)!r}))
        kernel = build_kernel(settings_for(backend), FakeClock())
        try:
            for _ in range(5):
                kernel.capture_many(
                    "alice", [say("I drink green tea"), say("I live in Lyon")],
                    request_token={token!r},
                )
        finally:
            kernel.close()
        """
    )
    return PythonChild(script)


def test_two_processes_retrying_at_once_record_it_once(backend: Backend, kernel: Uprof) -> None:
    consent(kernel, "alice")
    token = kernel.request_token("app:planner", "k1")
    killed_after_commit(backend, token)
    children = [retrier(backend, token), retrier(backend, token)]
    for child in children:
        _, err = child.communicate(CHILD_TIMEOUT_S)
        assert child.returncode == 0, err[-3000:]
    (entry,) = accepted(kernel)
    assert entry["reason_code"] == LATE
    assert exported_trail_verifies(kernel)
