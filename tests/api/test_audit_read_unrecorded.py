"""A page of the audit trail whose read cannot be recorded is not served (decision 0094).

Attack review of 2026-12-05: the append of ``audit.read`` fails (the log stays locked by
another writer past the retries). REST, the console's search and receipts pages and
the embedded SDK must then hand out no entry. Both backends. (Held on b9280be: kept as a guard.)
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from domain.errors import StoreBusyError
from tests.api.conftest import Apps, bearer, grant, interaction
from uprof.kernel import Uprof


@pytest.fixture
def reads_unrecordable(kernel: Uprof, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    refused: list[str] = []
    log = kernel.audit_log
    append = log.append

    def failing(entry: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if entry.get("action") == "audit.read":
            refused.append(entry["reason_code"])
            raise StoreBusyError("the audit log is locked by another writer")
        return append(entry, *args, **kwargs)

    monkeypatch.setattr(log, "append", failing)
    return refused


def test_no_page_is_served_when_its_read_cannot_be_recorded(
    http: httpx.Client, apps: Apps, kernel: Uprof, reads_unrecordable: list[str]
) -> None:
    grant(http, apps.planner)
    ack = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I want to learn the cello")},
    )
    assert ack.status_code == 201, ack.text
    for path in ("/v1/audit/entries", "/v1/audit/receipts"):
        answer = http.post(path, headers=bearer(apps.planner_operator), json={"limit": 10})
        assert answer.status_code == 409, (path, answer.status_code, answer.text)  # retry
        assert "items" not in answer.text and "consent.granted" not in answer.text
    with httpx.Client(base_url=str(http.base_url), timeout=30) as console:
        assert console.post("/console/login", data={"api_key": apps.planner_operator})
        page = console.get("/console", params={"action": "consent.granted"})
        assert "0 entries on this page" in page.text and "No entries match." in page.text
        assert "locked by another writer" in page.text  # the refusal is shown, no row
        receipts = console.get("/console/receipts")
        assert receipts.status_code == 409, receipts.status_code
    from uprof.sdk import Client

    embedded = Client.embedded(kernel, "app:planner", roles=("app", "operator"))
    try:
        with pytest.raises(Exception):  # noqa: B017  (whatever the SDK raises: no page)
            embedded.audit_entries(limit=10)
    finally:
        embedded.close()
    assert reads_unrecordable.count("entries") >= 3 and "receipts" in reads_unrecordable
    assert list(kernel.audit_entries(action="audit.read")) == []
