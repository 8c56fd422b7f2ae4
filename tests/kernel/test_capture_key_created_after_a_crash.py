"""A capture key whose ``key.created`` entry a crash kept off the log (both backends).

A capture commits its events and their keys, then appends ``capture.accepted`` with the
request's ``key.created`` (decision 0072). A process killed between the two (or an
append that fails) leaves keys the log never recorded as made; the client's retry finds
the request recorded and writes nothing. An event erasure of such a capture then wrote a
``key.destroyed`` (and a receipt) citing a commitment that no ``key.created`` entry
names, although docs/audit-format.md tells an auditor to find it earlier on the log.
Decision 0082 closed this for subject keys only: ``once_by`` compared values for
equality and could not find one commitment inside a creation entry's
``dek_commitments`` list. Now an event erasure writes the missing entry (``reason_code``
recorded-at-erasure) just before the ``key.destroyed``, only when no ``key.created`` of
the subject lists the commitment, once however many processes finish the erasure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from domain.errors import StoreBusyError
from tests.conftest import Backend
from tests.kernel.conftest import consent, say
from tests.kernel.other_process import crash_at, run_in_another_process
from tests.kernel.test_erasure_finish_race import eraser, receipt_of
from tests.kernel.test_erasure_resume import exported_trail_verifies
from uprof.kernel import Uprof

LATE = "recorded-at-erasure"


def created_commitments(entries: list[dict[str, Any]]) -> list[str]:
    """Every commitment a ``key.created`` entry names (a subject key's, a capture key's)."""
    found: list[str] = []
    for e in entries:
        if e["action"] == "key.created":
            found += [e["dek_commitment"]] if "dek_commitment" in e else e["dek_commitments"]
    return found


def log_of(kernel: Uprof) -> list[dict[str, Any]]:
    return [e.entry for e in kernel.audit_log.entries()]


def late_capture_entries(entries: list[dict[str, Any]]) -> list[str]:
    return [
        c
        for e in entries
        if e["action"] == "key.created" and e.get("reason_code") == LATE
        for c in e.get("dek_commitments", [])
    ]


def test_a_destroyed_capture_key_always_has_a_key_created_entry(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    consent(kernel, "alice")
    trail = kernel.capture_service._audit
    record_many = trail.record_many

    def dies_at_capture_accepted(entries: Any, **kwargs: Any) -> None:
        if any(action == "capture.accepted" for action, _ in entries):
            monkeypatch.setattr(trail, "record_many", record_many)
            raise StoreBusyError("the process is killed here")  # events and keys committed
        record_many(entries, **kwargs)

    monkeypatch.setattr(trail, "record_many", dies_at_capture_accepted)
    token = kernel.request_token("app:planner", "k1")
    with pytest.raises(StoreBusyError):
        kernel.capture_many("alice", [say("I drink green tea")], request_token=token)
    (lost,) = kernel.capture_many("alice", [say("I drink green tea")], request_token=token)
    (kept,) = kernel.capture_many("alice", [say("I live in Lyon")])  # recorded normally
    assert len(created_commitments(log_of(kernel))) == 2  # the subject key, Lyon's key

    kernel.erase_capture("alice", lost.capture_id)
    kernel.erase_capture("alice", kept.capture_id)

    entries = log_of(kernel)
    destroyed = [e["dek_commitment"] for e in entries if e["action"] == "key.destroyed"]
    assert len(destroyed) == 2
    assert set(destroyed) <= set(created_commitments(entries))
    # Only the lost one is recorded late, once, before its destruction.
    assert late_capture_entries(entries) == [destroyed[0]]
    position = {
        (e["action"], e.get("reason_code"), c): i
        for i, e in enumerate(entries)
        for c in [e.get("dek_commitment"), *e.get("dek_commitments", [])]
        if c
    }
    assert (
        position[("key.created", LATE, destroyed[0])]
        < position[("key.destroyed", "capture-key", destroyed[0])]
    )
    assert exported_trail_verifies(kernel)


def test_two_processes_finishing_an_event_erasure_record_a_lost_key_creation_once(
    backend: Backend, kernel: Uprof, tmp_path: Path
) -> None:
    """A capture killed (exit 9) between its commit and its audit append; its event
    erasure killed before the key went; two retries finish it at once."""
    consent(kernel, "alice")
    token = kernel.request_token("app:planner", "k1")
    died = run_in_another_process(
        backend,
        f"""
        from tests.kernel.conftest import say
        trail = kernel.capture_service._audit
        trail.record_many = lambda *args, **kwargs: os._exit(9)  # after the commit
        kernel.capture_many("alice", [say("I drink green tea")], request_token={token!r})
        """,
    )
    assert died.returncode == 9, died.stderr[-3000:]
    (lost,) = kernel.capture_many("alice", [say("I drink green tea")], request_token=token)
    assert len(created_commitments(log_of(kernel))) == 1  # the subject key only

    call = f'erase_capture("alice", {lost.capture_id!r})'
    died = crash_at(backend, "destroy_capture_key", call)
    assert died.returncode == 9, died.stderr[-3000:]
    meeting = tmp_path / "meeting"
    meeting.mkdir()
    first = eraser(backend, meeting, "first", call=call)
    second = eraser(backend, meeting, "second", call=call)
    receipts = [receipt_of(first), receipt_of(second)]

    cited = {
        a["dek_commitment"]
        for r in receipts
        for a in r["body"]["actions"]
        if a["type"] == "dek_destroyed"
    }
    assert len(cited) == 1
    entries = log_of(kernel)
    destroyed = [e["dek_commitment"] for e in entries if e["action"] == "key.destroyed"]
    assert destroyed == list(cited)
    assert late_capture_entries(entries) == list(cited)
    assert exported_trail_verifies(kernel)
