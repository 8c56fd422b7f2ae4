"""The privacy center's consent form names the field it refuses (SQLite and PostgreSQL, a
live server).

Until 2026-12-05 a malformed purpose typed in the form was refused with the REST API's
message, "purposes: purpose is malformed ...": the form has no field ``purposes`` (it
posts one ``purpose``), so the user was told about a field they never saw.
"""

from __future__ import annotations

import httpx

from tests.api.conftest import Apps, LiveServer, grant
from tests.web.conftest import csrf_of, open_link, privacy_link


def test_a_bad_grant_is_refused_naming_the_form_field_it_came_from(
    server: LiveServer, http: httpx.Client, apps: Apps
) -> None:
    grant(http, apps.planner)
    with httpx.Client(base_url=server.url, timeout=30) as user:
        open_link(user, privacy_link(http, apps.planner_operator, "alice"))
        csrf = csrf_of(user.get("/privacy").text)
        good = {"csrf": csrf, "app_id": "app:coach", "category": "*", "purpose": "coaching"}
        for field, bad in (
            ("purpose", "not a purpose!"),
            ("purpose", ""),
            ("app_id", "no app"),
            ("app_id", ""),
            ("category", "no-such-category"),
        ):
            refused = user.post("/privacy/consents/grant", data={**good, field: bad})
            assert refused.status_code == 422, (field, bad, refused.status_code)
            assert f"{field}: " in refused.text, (field, bad, refused.text)
            assert "purposes" not in refused.text, (field, bad)
        before = user.get("/privacy").text
        assert "app:coach" not in before  # nothing was recorded
        assert user.post("/privacy/consents/grant", data=good).status_code == 303
        assert "app:coach" in user.get("/privacy").text
