"""The findings of the web attack review (2026-12-05), replayed as a hostile browser, on
SQLite and PostgreSQL: each test failed on the code before its fix (docs/security.md,
"The web pages")."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import Apps, LiveServer, bearer, grant
from tests.web.conftest import deny_operators, lisbon_item, open_link
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
        deny_operators(kernel, "policy", "operations")
        assert http.get("/v1/policy", headers=bearer(apps.planner_operator)).status_code == 403
        refused = console.get("/console/policy")
        assert refused.status_code == 403, refused.text
        assert "role:assistant" not in refused.text and "<tr class=" not in refused.text
        assert "unreadable" not in refused.text


def _link(http: httpx.Client, apps: Apps, subject: str = "alice") -> str:
    issued = http.post(
        "/v1/privacy/links", headers=bearer(apps.planner_operator), json={"subject": subject}
    )
    assert issued.status_code == 201, issued.text
    return str(issued.json()["login_path"])


def test_opening_a_sign_in_link_neither_uses_it_nor_signs_anyone_in(
    server: LiveServer, http: httpx.Client, apps: Apps
) -> None:
    """Opening the link (a GET) burnt it and handed a session to whoever fetched it first:
    a mail scanner or link preview fetching the link took the user's session, and the
    user got "Link not valid". Now the GET shows a sign-in button; the POST it sends does
    the sign-in."""
    grant(http, apps.planner)
    login_path = _link(http, apps)
    scanner = httpx.get(server.url + login_path, timeout=30)
    assert scanner.status_code == 200, scanner.text
    assert "set-cookie" not in scanner.headers
    assert scanner.headers["referrer-policy"] == "no-referrer"
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        assert open_link(browser, login_path).status_code == 303
        assert browser.get("/privacy").status_code == 200
    # Still single use: the POST burnt it.
    with httpx.Client(base_url=server.url, timeout=30) as again:
        assert open_link(again, login_path, expect=403).status_code == 403


def test_another_site_cannot_sign_a_browser_in(
    server: LiveServer, http: httpx.Client, apps: Apps
) -> None:
    """Login CSRF: a page of another site posting its own link (or key) signs the
    visitor's browser into the attacker's privacy center or console session. The browser
    says where the form came from (Sec-Fetch-Site, Origin): such posts are refused, and
    the link stays unused."""
    grant(http, apps.planner)
    token = _link(http, apps).split("token=", 1)[1]
    with httpx.Client(base_url=server.url, timeout=30) as victim:
        for headers in (
            {"Sec-Fetch-Site": "cross-site", "Origin": "https://attacker.example"},
            {"Sec-Fetch-Site": "same-site", "Origin": "https://evil.uprof.example"},
            {"Origin": "null"},
            {"Origin": "https://attacker.example"},
        ):
            console = victim.post(
                "/console/login", data={"api_key": apps.planner_operator}, headers=headers
            )
            assert console.status_code == 403, (headers, console.text)
            assert "uprof_console" not in victim.cookies
            refused = victim.post("/privacy/login", data={"token": token}, headers=headers)
            assert refused.status_code == 403, (headers, refused.text)
            assert "uprof_privacy" not in victim.cookies
        # The same form from uprof's own page (the browser says same-origin) signs in.
        own = {"Sec-Fetch-Site": "same-origin", "Origin": server.url}
        signed = victim.post("/privacy/login", data={"token": token}, headers=own)
        assert signed.status_code == 303 and "uprof_privacy" in victim.cookies
        console = victim.post(
            "/console/login", data={"api_key": apps.planner_operator}, headers=own
        )
        assert console.status_code == 303 and "uprof_console" in victim.cookies


@pytest.mark.parametrize(
    ("action", "purpose"), [("export", "access-request"), ("erase", "erasure")]
)
def test_an_operator_denied_export_or_erase_cannot_hand_itself_a_link_that_does_it(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    action: str,
    purpose: str,
) -> None:
    """A link exercises the subject's rights, export and erasure included, whatever the
    operators' policy says. Issuing one asked only ``inspect``: an operator key whose
    ``export`` (or ``erase``) the deployment denies (REST 403) issued a link for any
    subject, opened it itself and downloaded the whole profile (or erased it)."""
    lisbon_item(http, apps, kernel)
    deny_operators(kernel, action, purpose)
    direct = "/v1/governance/exports" if action == "export" else "/v1/governance/erasures/subject"
    body = {"subject": "alice"}
    assert http.post(direct, headers=bearer(apps.planner_operator), json=body).status_code == 403
    issued = http.post("/v1/privacy/links", headers=bearer(apps.planner_operator), json=body)
    assert issued.status_code == 403, issued.text
    assert "token" not in issued.text


def test_an_operator_the_policy_denies_audit_gets_a_refusal_page_from_verify_and_residue(
    server: LiveServer, apps: Apps, kernel: Uprof
) -> None:
    """With operators denied ``audit``, the console's verify upload and residue scan
    raised the door's refusal past the page: the browser got the REST error's JSON
    instead of a page, and the receipts listing under the residue form was never shown."""
    from tests.web.conftest import csrf_of

    deny_operators(kernel, "audit", "compliance")
    with httpx.Client(base_url=server.url, timeout=30) as console:
        assert console.post("/console/login", data={"api_key": apps.planner_operator})
        csrf = csrf_of(console.get("/console/verify").text)
        verified = console.post(
            "/console/verify",
            data={"csrf": csrf, "kind": "export"},
            files={"upload": ("trail.jsonl", b"{}\n", "application/x-ndjson")},
        )
        scanned = console.post("/console/residue", data={"csrf": csrf, "terms": "Lisbon"})
    for refused in (verified, scanned):
        assert refused.status_code == 403, refused.text
        assert refused.headers["content-type"].startswith("text/html"), refused.text
        assert "Request refused" in refused.text
