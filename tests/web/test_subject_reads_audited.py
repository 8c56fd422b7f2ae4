"""Every page that shows a subject's data leaves an audit entry before it is served
(SQLite and PostgreSQL, a live server).

Until 2026-12-05 only the privacy center's export and sign-in were on the log: the
profile page (every attribute, memory, intent and consent of the subject, the captured text
behind them and who read them) and the erasure confirmation of one item (the item's text)
were served without an entry, as were the REST reads of a whole profile, of an item's
evidence and of a memory page (``/v1/profile/read``, ``/v1/evidence/read``,
``/v1/memories/list``) and their CLI commands. Each is now recorded (``subject.read``: who,
as the principal; the subject as its pseudonym; why, the purpose the read was decided for;
what, as counts and item ids, never content) before it is answered, and a read that
cannot be recorded is not answered (503 ``read_not_recorded``).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from domain.principal import PRIVACY_CENTER
from tests.api.conftest import PLANNER, Apps, LiveServer, bearer, grant
from tests.web.conftest import lisbon_item, open_link, privacy_link
from uprof.kernel import Uprof


def _entries(kernel: Uprof) -> list[dict[str, Any]]:
    kernel.reads.drain()
    return [e.entry for e in kernel.audit_log.entries()]


def _reads(kernel: Uprof, principal: str | None = None) -> list[dict[str, Any]]:
    return [
        e
        for e in _entries(kernel)
        if e["action"] == "subject.read" and (principal is None or e["principal"] == principal)
    ]


def _link_principal(kernel: Uprof) -> str:
    used = [e for e in _entries(kernel) if e["action"] == "privacy_link.used"]
    return f"{PRIVACY_CENTER}#{used[-1]['link_id']}"


def test_the_privacy_profile_page_is_recorded_under_its_link(
    server: LiveServer, http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    item = lisbon_item(http, apps, kernel).item_id
    pseudonym = kernel.subjects.pseudonym("alice")
    with httpx.Client(base_url=server.url, timeout=30) as user:
        open_link(user, privacy_link(http, apps.planner_operator, "alice"))
        link = _link_principal(kernel)
        assert _reads(kernel, link) == []  # signing in shows nothing yet
        page = user.get("/privacy")
        assert page.status_code == 200 and "Lisbon" in page.text
        [read] = _reads(kernel, link)
        assert read["subject_ref"] == pseudonym
        assert read["purpose"] == "access-request"
        assert read["reason_code"] == "profile"
        assert read["app_id"] == PRIVACY_CENTER
        shown = read["counts"]
        assert shown["consents"] == 1
        assert shown["attributes"] + shown["memories"] + shown["intents"] >= 1
        # Each view is one entry; the erasure confirmation of one item is another.
        assert user.get("/privacy").status_code == 200
        confirm = user.get("/privacy/erase", params={"item_id": item})
        assert confirm.status_code == 200 and "Lisbon" in confirm.text
        reads = _reads(kernel, link)
        assert [r["reason_code"] for r in reads] == ["profile", "profile", "evidence"]
        assert reads[2]["item_refs"] == [item] and reads[2]["subject_ref"] == pseudonym
        # The confirmation page without an item shows no data and records nothing.
        assert user.get("/privacy/erase").status_code == 200
        assert len(_reads(kernel, link)) == 3
    # Never the subject's name or any captured text on the log.
    for entry in _reads(kernel):
        text = str(entry)
        assert "alice" not in text and "Lisbon" not in text


def test_a_page_whose_read_cannot_be_recorded_is_not_served(
    server: LiveServer,
    http: httpx.Client,
    kernel: Uprof,
    apps: Apps,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    item = lisbon_item(http, apps, kernel).item_id
    with httpx.Client(base_url=server.url, timeout=30) as user:
        open_link(user, privacy_link(http, apps.planner_operator, "alice"))
        before = kernel.audit_log.size()
        real_append = kernel.audit_log.append

        def failing(entry: Any, *args: Any, **kwargs: Any) -> Any:
            if entry.get("action") == "subject.read":
                raise sa.exc.OperationalError("INSERT", {}, Exception("disk I/O error"))
            return real_append(entry, *args, **kwargs)

        monkeypatch.setattr(kernel.audit_log, "append", failing)
        for page in (user.get("/privacy"), user.get("/privacy/erase", params={"item_id": item})):
            assert page.status_code == 503, page.text[-2000:]
            assert "could not be recorded" in page.text and "Lisbon" not in page.text
        for path, body in (
            ("/v1/profile/read", {"subject": "alice"}),
            ("/v1/evidence/read", {"subject": "alice", "item_id": item}),
        ):
            answer = http.post(path, headers=bearer(apps.planner_operator), json=body)
            assert answer.status_code == 503, (path, answer.text)
            assert answer.json()["error"]["code"] == "read_not_recorded"
            assert "Lisbon" not in answer.text
        monkeypatch.undo()
        assert kernel.audit_log.size() == before
        assert user.get("/privacy").status_code == 200  # recorded again: served again


def test_the_rest_reads_of_a_profile_are_recorded_under_their_key(
    http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    item = lisbon_item(http, apps, kernel).item_id
    key = bearer(apps.planner_operator)
    principal = f"{PLANNER}#{apps.planner_operator.split('_')[1]}"
    assert http.post("/v1/profile/read", headers=key, json={"subject": "alice"}).is_success
    assert http.post(
        "/v1/evidence/read", headers=key, json={"subject": "alice", "item_id": item}
    ).is_success
    assert http.post("/v1/memories/list", headers=key, json={"subject": "alice"}).is_success
    reads = _reads(kernel, principal)
    assert [r["reason_code"] for r in reads] == ["profile", "evidence", "memories"]
    pseudonym = kernel.subjects.pseudonym("alice")
    assert all(r["subject_ref"] == pseudonym for r in reads)
    assert all(r["purpose"] == "operations" and r["app_id"] == PLANNER for r in reads)
    assert reads[1]["item_refs"] == [item]
    # An unknown subject shows nothing and records no read.
    missing = http.post("/v1/profile/read", headers=key, json={"subject": "nobody"})
    assert missing.status_code == 404
    assert len(_reads(kernel)) == 3


def test_pages_without_subject_data_record_no_read(
    server: LiveServer, http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    """The inventory of what is not recorded as a subject read: the stylesheet, the
    sign-in pages, the privacy center's receipts (the session's own erasure receipts,
    no profile data), and every console page (the console shows no subject's profile:
    its audit search and receipts list record ``audit.read``, its export
    ``audit.exported``; the policy, key and verification pages hold no subject data)."""
    grant(http, apps.planner)
    with (
        httpx.Client(base_url=server.url, timeout=30) as user,
        httpx.Client(base_url=server.url, timeout=30) as console,
    ):
        open_link(user, privacy_link(http, apps.planner_operator, "alice"))
        assert user.get("/privacy/receipts").status_code == 200
        assert user.get("/web/style.css").status_code == 200
        assert user.get("/privacy/login", params={"token": "x"}).status_code == 200
        assert console.get("/console/login").status_code == 200
        signed = console.post("/console/login", data={"api_key": apps.planner_operator})
        assert signed.status_code == 303
        for path in ("/console/policy", "/console/verify", "/console/public-key.pem"):
            assert console.get(path).status_code == 200, path
        assert console.get("/console", params={"subject": "alice"}).status_code == 200
        assert console.get("/console/receipts").status_code == 200
    assert _reads(kernel) == []
    actions = [e["action"] for e in _entries(kernel)]
    assert actions.count("audit.read") == 2
