"""Over REST: a keyed capture whose audit append failed after its commit is recorded
when the client retries with the same ``Idempotency-Key`` (``capture.accepted``,
``reason_code`` recorded-late), once. Both backends; the failure is made in process
(tests/kernel/test_capture_accepted_after_a_crash.py kills a real process)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from domain.errors import StoreBusyError
from tests.api.conftest import Apps, bearer, grant, interaction
from uprof.kernel import Uprof


def test_a_keyed_rest_retry_records_the_lost_capture_accepted(
    http: httpx.Client, apps: Apps, kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    grant(http, apps.planner)
    trail = kernel.capture_service._audit
    record_many = trail.record_many

    def dies_at_capture_accepted(entries: Any, **kwargs: Any) -> None:
        if any(action == "capture.accepted" for action, _ in entries) and not kwargs:
            monkeypatch.setattr(trail, "record_many", record_many)
            raise StoreBusyError("the append fails after the commit")
        record_many(entries, **kwargs)

    monkeypatch.setattr(trail, "record_many", dies_at_capture_accepted)
    headers = {**bearer(apps.planner), "Idempotency-Key": "k-1"}
    body = {"subject": "alice", **interaction("I drink green tea")}
    first = http.post("/v1/captures", headers=headers, json=body)
    assert first.status_code == 409, first.text  # StoreBusyError: "retry"
    assert not list(kernel.audit_log.entries(action="capture.accepted"))

    retried = http.post("/v1/captures", headers=headers, json=body)
    assert retried.status_code == 201, retried.text
    again = http.post("/v1/captures", headers=headers, json=body)
    assert again.json() == retried.json()

    (entry,) = [e.entry for e in kernel.audit_log.entries(action="capture.accepted")]
    assert entry["reason_code"] == "recorded-late"
    assert entry["notification_id"] == retried.json()["notification_id"]
    assert entry["principal"].startswith("app:planner#")
