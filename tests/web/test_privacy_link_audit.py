"""Issuing a privacy-center sign-in link is audited.

A link opens a subject's whole privacy center (profile, export, erasure) to whoever holds
it, and the operator key that asks for it receives it. Until 2026-12-05 issuing one left
no audit entry: the log showed what the link's holder then did, as the subject, but not
who had been handed that access. It is now recorded (``privacy_link.issued``: the
subject's pseudonym and the issuing principal; never the token).
"""

from __future__ import annotations

import httpx

from tests.api.conftest import PLANNER, Apps, grant
from tests.web.conftest import privacy_link
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
