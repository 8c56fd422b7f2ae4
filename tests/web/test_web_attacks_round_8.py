"""Hostile callers, round 8, on the web pages (decision XXXX-hostile-callers-round-8), on
SQLite and PostgreSQL against a live server: each test failed on the code before its fix."""

from __future__ import annotations

import httpx

from tests.api.conftest import Apps, LiveServer, bearer
from uprof.kernel import Uprof


def _deny_operators(kernel: Uprof, action: str, purpose: str) -> None:
    kernel.policy_grant(
        requested_by="test",
        role="role:operator",
        actions=[action],
        categories=["any"],
        purpose=purpose,
        effect="deny",
    )


def test_an_export_the_policy_refuses_is_the_refusal_page_with_403(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    """Bug LP: with operators denied ``audit`` (REST: 403), the console's audit download
    answered 422 "Export refused", the status of a malformed search, for the door's
    refusal: the one console page not giving the status REST gives (docs/web.md). The
    refusal is on the log, as every policy denial; a bad time is still 422."""
    with httpx.Client(base_url=server.url, timeout=30) as console:
        assert console.post("/console/login", data={"api_key": apps.planner_operator})
        assert console.get("/console/audit/export").status_code == 200
        _deny_operators(kernel, "audit", "compliance")
        rest = http.post("/v1/audit/export", headers=bearer(apps.planner_operator), json={})
        assert rest.status_code == 403, rest.text
        kernel.reads.drain()
        before = _denials(kernel)
        for params in ({}, {"format": "csv"}, {"subject": "alice"}):
            refused = console.get("/console/audit/export", params=params)
            assert refused.status_code == 403, (params, refused.status_code, refused.text[:200])
            assert refused.headers["content-type"].startswith("text/html")
            assert "Request refused" in refused.text
            assert "checkpoint" not in refused.text
        kernel.reads.drain()
        assert _denials(kernel) - before == 3
        bad = console.get("/console/audit/export", params={"since": "2026-13-01"})
        assert bad.status_code == 422 and "since: not a date and time" in bad.text


def _denials(kernel: Uprof) -> int:
    return sum(1 for e in kernel.audit_log.entries() if e.entry["action"] == "access.denied")
