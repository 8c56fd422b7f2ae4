"""The console's audit search names the field it refuses (SQLite and PostgreSQL, a live
server)."""

from __future__ import annotations

import httpx

from tests.api.conftest import Apps, LiveServer


def test_a_bad_time_in_the_audit_search_is_refused_naming_its_field(
    server: LiveServer, apps: Apps
) -> None:
    """Until 2026-12-05 the search answered 200 with "not a date and time: 'garbage'":
    neither the field (``since`` or ``until``) nor the status said it was refused, and the
    page read like a search that matched nothing."""
    with httpx.Client(base_url=server.url, timeout=30) as console:
        signed = console.post("/console/login", data={"api_key": apps.planner_operator})
        assert signed.status_code == 303
        for field in ("since", "until"):
            page = console.get("/console", params={field: "garbage", "app": "app:planner"})
            assert page.status_code == 422, (field, page.status_code)
            assert f"{field}: not a date and time" in page.text
            assert 'value="garbage"' in page.text  # the form keeps what was typed
            export = console.get("/console/audit/export", params={field: "2026-13-01"})
            assert export.status_code == 422
            assert f"{field}: not a date and time" in export.text
