"""The findings of the web attack review (2026-12-05), replayed as a hostile browser, on
SQLite and PostgreSQL: each test failed on the code before its fix (docs/security.md,
"The web pages")."""

from __future__ import annotations

import httpx

from tests.api.conftest import Apps, LiveServer, bearer
from uprof.kernel import Uprof


def test_the_console_shows_no_policy_to_an_operator_the_policy_denies_reading_it(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    """The policy page read "who may do what" from the authorizer itself, outside the
    door: with operators denied ``policy`` (REST: 403) the console still listed every
    app's rules, under a banner calling the store unreadable."""
    with httpx.Client(base_url=server.url, timeout=30) as console:
        assert console.post("/console/login", data={"api_key": apps.planner_operator})
        shown = console.get("/console/policy")
        assert shown.status_code == 200 and "role:assistant" in shown.text
        kernel.policy_grant(
            requested_by="test",
            role="role:operator",
            actions=["policy"],
            categories=["any"],
            purpose="operations",
            effect="deny",
        )
        assert http.get("/v1/policy", headers=bearer(apps.planner_operator)).status_code == 403
        refused = console.get("/console/policy")
        assert refused.status_code == 403, refused.text
        assert "role:assistant" not in refused.text and "<tr class=" not in refused.text
        assert "unreadable" not in refused.text
