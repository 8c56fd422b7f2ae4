"""Attacks on decision 0141 (exact erasure attribution, erasure outcomes), on SQLite and
PostgreSQL (decision XXXX-review-of-0141)."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy.exc

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, say, settings_for
from tests.kernel.test_two_erasures_at_once import outcomes_of_every_request


def _storage_error(*args: Any, **kwargs: Any) -> Any:
    raise sqlalchemy.exc.OperationalError("SELECT", {}, Exception("database is locked"))


@pytest.mark.parametrize("step", ["preview", "ledger"])
def test_an_event_erasure_failing_at_its_key_preview_or_ledger_record_has_an_outcome(
    backend: Backend, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HX: GX gave ``erasure.failed`` to an event erasure failing at its ``CaptureErased``
    append, but its key preview and ledger record, still before the ledger holds it, sat
    outside ``_refusal_recorded``: a storage error there left the request without any
    outcome, and its in-flight mark was removed, so no start ever settled it."""
    kernel = build_kernel(settings_for(backend), FakeClock())
    try:
        consent(kernel, "alice")
        capture_id = kernel.capture("alice", say("I want to learn to sail")).capture_id
        service = kernel.erasure_service
        if step == "preview":
            monkeypatch.setattr(service._keystore, "capture_key_commitment", _storage_error)
        else:
            ledger = service._keystore.ledger
            assert ledger is not None
            monkeypatch.setattr(ledger, "record_captures", _storage_error)
        with pytest.raises(sqlalchemy.exc.OperationalError):
            kernel.erase_capture("alice", capture_id)
        monkeypatch.undo()
        outcomes = outcomes_of_every_request(kernel)
        assert list(outcomes.values()) == [["erasure.failed"]], outcomes  # main: [[]]
    finally:
        kernel.close()
