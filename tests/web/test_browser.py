"""The privacy center and the compliance console in headless Chromium, end to end.

Each test runs a real uvicorn server on loopback (SQLite, background workers on, as
``uprof serve`` runs) and drives Debian's Chromium through Playwright.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from audit.receipts import verify_receipt
from tests.api.conftest import Apps, LiveServer, bearer, grant, interaction
from tests.web.conftest import needs_chromium, privacy_link, shot
from uprof.kernel import Uprof

pytestmark = [needs_chromium, pytest.mark.parametrize("backend", ["sqlite"], indirect=True)]


def capture(http: httpx.Client, key: str, subject: str, text: str) -> httpx.Response:
    return http.post(
        "/v1/captures", headers=bearer(key), json={"subject": subject, **interaction(text)}
    )


def seed(http: httpx.Client, apps: Apps, subject: str, text: str) -> None:
    grant(http, apps.planner, subject=subject)
    response = capture(http, apps.planner, subject, text)
    assert response.status_code == 201, response.text


def sign_in_user(page: Any, link: str) -> Any:
    """Open a sign-in link and press its button; return the answer to the button's post."""
    page.goto(link)
    with page.expect_navigation() as signed:
        page.get_by_role("button", name="Sign in").click()
    return signed.value


def sign_in_operator(page: Any, server: LiveServer, key: str) -> None:
    page.goto(f"{server.url}/console/login")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{server.url}/console")


def test_withdrawn_consent_refuses_the_next_capture(
    page: Any, server: LiveServer, http: httpx.Client, apps: Apps
) -> None:
    seed(http, apps, "alice", "I live in Lisbon and I want to run a half marathon")
    served = http.post(
        "/v1/slices",
        headers=bearer(apps.planner),
        json={
            "subject": "alice",
            "query": "where do I live and what do I want?",
            "budget_tokens": 512,
            "purpose": "personalization",
            "agent_id": "agent:one",
        },
    )
    assert served.status_code == 200, served.text
    sign_in_user(page, server.url + privacy_link(http, apps.planner_operator, "alice"))
    page.wait_for_url(f"{server.url}/privacy")
    page.get_by_role("heading", name="Your privacy center").wait_for()
    assert "Lisbon" in page.content()
    # The profile shows which app read each item (the slice just served).
    assert "app:planner for personalization" in page.content()
    page.locator("details").first.evaluate("d => d.open = true")
    shot(page, "privacy-profile")

    page.get_by_role("button", name="Withdraw consent for app:planner").click()
    page.get_by_text("Consent withdrawn").wait_for()
    row = page.locator("tr", has_text="app:planner")
    assert "withdrawn" in row.inner_text()
    shot(page, "privacy-consent-withdrawn")

    refused = capture(http, apps.planner, "alice", "I also like jazz")
    assert refused.status_code == 403, refused.text


def test_erasing_everything_gives_a_receipt_that_verifies(
    page: Any,
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    tmp_path: Path,
) -> None:
    seed(http, apps, "alice", "I live in Lisbon and I want to run a half marathon")
    sign_in_user(page, server.url + privacy_link(http, apps.planner_operator, "alice"))
    page.get_by_role("heading", name="Your privacy center").wait_for()

    with page.expect_download() as exported:
        page.get_by_role("link", name="Download my data (JSON)").click()
    export = json.loads(Path(exported.value.path()).read_text())
    assert any("Lisbon" in c["user_input"] for c in export["captured_events"])

    page.get_by_role("link", name="Erase everything…").click()
    page.get_by_role("heading", name="Confirm erasure").wait_for()
    shot(page, "privacy-erase-confirm")
    page.get_by_label("I understand this cannot be undone").check()
    page.get_by_role("button", name="Erase everything").click()
    page.get_by_role("heading", name="Erasure receipts").wait_for()
    shot(page, "privacy-receipts")

    with page.expect_download() as downloaded:
        page.get_by_role("link", name="Download receipt 1 (JSON)").click()
    receipt = json.loads(Path(downloaded.value.path()).read_text())
    verify_receipt(
        receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin
    )  # raises if it does not verify

    # The operator sees the receipt in the log, verifies the file, and finds no residue.
    sign_in_operator(page, server, apps.planner_operator)
    page.get_by_role("link", name="Receipts & residue").click()
    assert receipt["body"]["receipt_id"] in page.content()
    page.get_by_label("Terms the erased data held (one per line)").fill("Lisbon\nhalf marathon")
    page.get_by_role("button", name="Scan every store").click()
    page.get_by_text("Residue: 0").wait_for()
    shot(page, "console-receipts-residue")

    page.get_by_role("link", name="Verify").click()
    page.get_by_label("Erasure receipt (JSON)").check()
    page.set_input_files(
        "#upload",
        files=[
            {
                "name": "receipt.json",
                "mimeType": "application/json",
                "buffer": json.dumps(receipt).encode(),
            }
        ],
    )
    page.get_by_role("button", name="Verify").click()
    page.get_by_role("heading", name="Verified").wait_for()


def test_a_tampered_export_names_the_failing_entry(
    page: Any, server: LiveServer, http: httpx.Client, apps: Apps
) -> None:
    seed(http, apps, "alice", "I live in Lisbon and I want to run a half marathon")
    seed(http, apps, "bob", "I live in Porto")
    sign_in_operator(page, server, apps.planner_operator)
    page.get_by_label("App").fill("app:planner")
    page.get_by_role("button", name="Search").click()
    page.get_by_role("cell", name="capture.accepted").first.wait_for()
    page.goto(f"{server.url}/console?subject=alice")
    assert "Pseudonym searched: subj_" in page.locator("main").inner_text()
    # alice's key, consent, capture and its capture key, not bob's
    assert page.locator("tbody tr").count() == 4
    shot(page, "console-audit")
    page.goto(f"{server.url}/console")

    with page.expect_download() as downloaded:
        page.get_by_role("link", name="JSONL").click()
    lines = Path(downloaded.value.path()).read_text().splitlines()
    number = next(
        n for n, line in enumerate(lines, start=1) if n > 2 and '"app_id":"app:planner"' in line
    )
    leaf = json.loads(lines[number - 1])["leaf_index"]
    lines[number - 1] = lines[number - 1].replace(
        '"app_id":"app:planner"', '"app_id":"app:plannex"', 1
    )

    page.get_by_role("link", name="Verify").click()
    page.set_input_files(
        "#upload",
        files=[
            {
                "name": "trail.jsonl",
                "mimeType": "application/x-ndjson",
                "buffer": ("\n".join(lines) + "\n").encode(),
            }
        ],
    )
    page.get_by_role("button", name="Verify").click()
    page.get_by_role("heading", name="Verification failed").wait_for()
    assert page.locator("#failing-line").inner_text() == str(number)
    assert page.locator("#failing-leaf").inner_text() == str(leaf)
    shot(page, "console-verify-failed")

    page.get_by_role("link", name="Policy").click()
    page.get_by_role("heading", name="app:planner").wait_for()
    shot(page, "console-policy")


def test_a_key_without_the_operator_role_gets_403(
    page: Any, server: LiveServer, apps: Apps
) -> None:
    page.goto(f"{server.url}/console/policy")
    page.wait_for_url(f"{server.url}/console/login")  # no session: sign in first
    shot(page, "console-login")
    page.get_by_label("API key").fill(apps.planner)
    with page.expect_response(f"{server.url}/console/login") as answer:
        page.get_by_role("button", name="Sign in").click()
    assert answer.value.status == 403
    page.get_by_role("heading", name="Forbidden").wait_for()
    page.goto(f"{server.url}/console/audit/export?format=jsonl")
    page.wait_for_url(f"{server.url}/console/login")


def test_a_user_link_never_reaches_another_users_page(
    page: Any, server: LiveServer, http: httpx.Client, apps: Apps
) -> None:
    seed(http, apps, "alice", "I live in Lisbon and I want to run a half marathon")
    seed(http, apps, "bob", "I live in Porto and I want to learn the cello")
    link = server.url + privacy_link(http, apps.planner_operator, "alice")
    sign_in_user(page, link)
    page.get_by_role("heading", name="Your privacy center").wait_for()
    assert "Lisbon" in page.content() and "Porto" not in page.content()

    # The subject comes from the session only: URL and form fields naming bob change nothing.
    page.goto(f"{server.url}/privacy?subject=bob")
    assert "Lisbon" in page.content() and "Porto" not in page.content()
    # (page.request shares the tab's cookies: the download as the browser would get it.)
    export = page.request.get(f"{server.url}/privacy/export.json?subject=bob").text()
    assert "Lisbon" in export and "Porto" not in export

    # The link was single-use: opening it again (here or elsewhere) is refused.
    response = sign_in_user(page, link)
    assert response is not None and response.status == 403
    page.get_by_role("heading", name="Link not valid").wait_for()
    # ...and the session that link opened is still alice's, never anyone else's.
    page.goto(f"{server.url}/privacy")
    assert "Lisbon" in page.content() and "Porto" not in page.content()
    # A user session is no operator session.
    page.goto(f"{server.url}/console")
    page.wait_for_url(f"{server.url}/console/login")


def test_a_page_of_another_site_cannot_use_or_plant_a_sign_in(
    page: Any, server: LiveServer, http: httpx.Client, apps: Apps
) -> None:
    """A link previewed or fetched by another site's page opens no session, and a page of
    another site posting a link's token (login CSRF) is refused by what Chromium itself
    says of the form (Sec-Fetch-Site); the link stays usable from uprof's own page."""
    seed(http, apps, "alice", "I live in Lisbon")
    link = server.url + privacy_link(http, apps.planner_operator, "alice")
    token = link.split("token=", 1)[1]
    attacker = "http://attacker.test/"
    page.route(
        attacker,
        lambda route: route.fulfill(
            content_type="text/html",
            body=(
                f'<form id="f" method="post" action="{server.url}/privacy/login">'
                f'<input type="hidden" name="token" value="{token}"></form>'
                "<script>document.getElementById('f').submit()</script>"
            ),
        ),
    )
    with page.expect_navigation(url=f"{server.url}/privacy/login"):
        page.goto(attacker)
    page.get_by_role("heading", name="Form from another site").wait_for()
    assert not [c for c in page.context.cookies() if c["name"] == "uprof_privacy"]
    # Fetched by a page (a preview, a scanner), the link opens the sign-in page only.
    assert page.request.get(link).status == 200
    assert not [c for c in page.context.cookies() if c["name"] == "uprof_privacy"]
    # The user's own click still signs in: the link was not used by any of the above.
    assert sign_in_user(page, link).status == 200  # the profile, after the redirect
    page.wait_for_url(f"{server.url}/privacy")
    assert "Lisbon" in page.content()


def test_an_apps_text_cannot_reverse_what_the_privacy_center_says_around_it(
    page: Any, server: LiveServer, http: httpx.Client, apps: Apps
) -> None:
    """A capture ending in U+202E (right-to-left override) reversed the rest of its line
    in the privacy center: "— app:planner, personalization, <date>" after the quoted
    evidence was drawn right to left, so an app id chosen to read as another when reversed
    (``knab:ppa``) showed as "app:bank". App and user text is isolated (``<bdi>``)."""
    seed(http, apps, "alice", "I live in Lisbon\u202e")
    sign_in_user(page, server.url + privacy_link(http, apps.planner_operator, "alice"))
    page.wait_for_url(f"{server.url}/privacy")
    page.locator("details").first.evaluate("d => d.open = true")
    evidence = page.locator("li", has_text="Lisbon").first
    # Where the browser draws the first and the last character of the app id after it.
    first_x, last_x = evidence.evaluate(
        """li => {
            const text = [...li.childNodes].find(n => n.nodeType === 3 && n.data.includes('app:'));
            const at = text.data.indexOf('app:planner');
            const range = document.createRange();
            const x = i => { range.setStart(text, i); range.setEnd(text, i + 1);
                             return range.getBoundingClientRect().x; };
            return [x(at), x(at + 'app:planner'.length - 1)];
        }"""
    )
    assert first_x < last_x, "the app id after the evidence is drawn right to left"
