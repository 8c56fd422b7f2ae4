"""Issuing a privacy-center sign-in link is audited.

A link opens a subject's whole privacy center (profile, export, erasure) to whoever holds
it, and the operator key that asks for it receives it. Until 2026-12-05 issuing one left
no audit entry: the log showed what the link's holder then did, as the subject, but not
who had been handed that access. It is now recorded (``privacy_link.issued``: the
subject's pseudonym and the issuing principal; never the token).
"""

from __future__ import annotations

import httpx

from domain.principal import PRIVACY_CENTER
from tests.api.conftest import PLANNER, Apps, LiveServer, grant
from tests.web.conftest import open_link, privacy_link
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof


def test_issuing_a_privacy_link_is_audited_without_its_token(
    http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    grant(http, apps.planner)
    path = privacy_link(http, apps.planner_operator, "alice")
    token = path.split("token=", 1)[1]
    kernel.reads.drain()
    entries = list(kernel.audit_log.entries())
    issued = [e.entry for e in entries if e.entry["action"] == "privacy_link.issued"]
    assert len(issued) == 1
    assert issued[0]["subject_ref"] == kernel.subjects.pseudonym("alice")
    key_id = apps.planner_operator.split("_")[1]
    assert issued[0]["principal"] == f"{PLANNER}#{key_id}"
    assert not any(token in e.entry_json for e in entries)
    # An unknown subject gets no link and no entry.
    refused = http.post(
        "/v1/privacy/links",
        headers={"Authorization": f"Bearer {apps.planner_operator}"},
        json={"subject": "nobody"},
    )
    assert refused.status_code == 404
    assert [e.entry["action"] for e in kernel.audit_log.entries()].count("privacy_link.issued") == 1


def test_what_a_link_does_is_audited_under_that_link_and_joins_its_issuer(
    server: LiveServer, http: httpx.Client, kernel: Uprof, apps: Apps, keys: ApiKeyStore
) -> None:
    """Each link has an id: its issuing entry names it with the key that was handed the
    link, its use (the session opening) is recorded under it, and so is everything done in
    the session it opens. Until 2026-12-05 every privacy-center entry read
    ``privacy-center#link``: with two operators holding links for one subject, nothing
    told whose link exported or erased, and opening a link (which shows the whole
    profile) left no entry at all."""
    grant(http, apps.planner)
    other_operator = keys.create(PLANNER, ["app", "operator"]).token
    sessions = []
    for operator in (apps.planner_operator, other_operator):
        browser = httpx.Client(base_url=server.url, timeout=30)
        open_link(browser, privacy_link(http, operator, "alice"))
        sessions.append(browser)
    first, second = sessions
    try:
        assert first.get("/privacy/export.json").status_code == 200
        assert second.get("/privacy/export.json").status_code == 200
        assert second.get("/privacy/export.json").status_code == 200
    finally:
        for browser in sessions:
            browser.close()
    kernel.reads.drain()
    entries = [e.entry for e in kernel.audit_log.entries()]
    issued = [e for e in entries if e["action"] == "privacy_link.issued"]
    links = [e.get("link_id") for e in issued]
    assert all(links) and len(set(links)) == 2, issued
    assert [e["principal"].split("#")[1] for e in issued] == [
        key.split("_")[1] for key in (apps.planner_operator, other_operator)
    ]
    pseudonym = kernel.subjects.pseudonym("alice")
    for link, exports in zip(links, (1, 2), strict=True):
        by_link = [e for e in entries if e.get("principal") == f"{PRIVACY_CENTER}#{link}"]
        assert [e["action"] for e in by_link] == ["privacy_link.used"] + ["subject.exported"] * (
            exports
        ), by_link
        assert by_link[0]["subject_ref"] == pseudonym
        assert by_link[0]["link_id"] == link
