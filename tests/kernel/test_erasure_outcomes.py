"""Every requested erasure ends with an outcome on the audit log (bug GX, decision
XXXX-exact-erasure-attribution), on SQLite and PostgreSQL.

A request that fails on a storage error between its ``erasure.requested`` entry and
its ledger record (a lock timeout, a lost connection) answered with the error and left
the request without any outcome entry: neither ``projection.purged`` nor
``erasure.refused``. It now ends with ``erasure.failed`` (``reason_code`` the error's
class), and asking again is a new request that completes.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy.exc

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, say, settings_for
from tests.kernel.test_two_erasures_at_once import outcomes_of_every_request


def _storage_error(*args: Any, **kwargs: Any) -> int:
    raise sqlalchemy.exc.OperationalError("INSERT", {}, Exception("database is locked"))


@pytest.mark.parametrize("step", ["tombstone", "ledger"])
def test_a_subject_erasure_failing_on_storage_before_its_ledger_record_has_an_outcome(
    backend: Backend, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = build_kernel(settings_for(backend), FakeClock())
    try:
        consent(kernel, "alice")
        kernel.capture("alice", say("I want to learn to sail"))
        service = kernel.erasure_service
        if step == "tombstone":
            monkeypatch.setattr(service._app, "append_subject_tombstone", _storage_error)
        else:
            ledger = service._keystore.ledger
            assert ledger is not None
            monkeypatch.setattr(ledger, "record_subject", _storage_error)
        with pytest.raises(sqlalchemy.exc.OperationalError):
            kernel.erase_subject("alice")
        monkeypatch.undo()
        failed = [e.entry for e in kernel.audit_log.entries(action="erasure.failed")]
        assert [(e["reason_code"]) for e in failed] == ["OperationalError"], failed
        outcomes = outcomes_of_every_request(kernel)
        assert list(outcomes.values()) == [["erasure.failed"]], outcomes  # main: [[]]
        receipt = kernel.erase_subject("alice").receipt  # a new request, which completes
        assert receipt["body"]["request"]["request_id"] != failed[0]["request_id"]
        assert sorted(map(sorted, outcomes_of_every_request(kernel).values())) == [
            ["erasure.failed"],
            ["projection.purged"],
        ]
    finally:
        kernel.close()


def test_an_event_erasure_failing_on_storage_before_its_ledger_record_has_an_outcome(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = build_kernel(settings_for(backend), FakeClock())
    try:
        consent(kernel, "alice")
        capture_id = kernel.capture("alice", say("I want to learn to sail")).capture_id
        monkeypatch.setattr(kernel.erasure_service._app, "with_retry", _storage_error)
        with pytest.raises(sqlalchemy.exc.OperationalError):
            kernel.erase_capture("alice", capture_id)
        monkeypatch.undo()
        outcomes = outcomes_of_every_request(kernel)
        assert list(outcomes.values()) == [["erasure.failed"]], outcomes  # main: [[]]
    finally:
        kernel.close()
