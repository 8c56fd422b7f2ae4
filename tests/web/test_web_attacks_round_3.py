"""Attacks on the web pages that held in the review of 2026-12-05 (round 3), kept as
tests: over plain HTTP against a live server, SQLite and PostgreSQL."""

from __future__ import annotations

import re
import time

import httpx

from tests.api.conftest import Apps, LiveServer, bearer, grant, interaction
from tests.web.conftest import csrf_of, open_link, privacy_link
from uprof.web.pages import OPERATOR_COOKIE, USER_COOKIE


def _item_of(browser: httpx.Client, text: str) -> str:
    for _ in range(100):  # the pipeline extracts in the background
        page = browser.get("/privacy").text
        found = re.search(r'data-item="([^"]+)"', page)
        if found and text in page:
            return found.group(1)
        time.sleep(0.1)
    raise AssertionError(f"no item with {text!r} on the page")


def test_a_session_reaches_no_item_and_no_page_of_another_subject(
    server: LiveServer, http: httpx.Client, apps: Apps
) -> None:
    for subject, said in (("alice", "I live in Lisbon"), ("bob", "I live in Porto")):
        grant(http, apps.planner, subject=subject)
        captured = http.post(
            "/v1/captures",
            headers=bearer(apps.planner),
            json={"subject": subject, **interaction(said)},
        )
        assert captured.status_code == 201, captured.text
    with (
        httpx.Client(base_url=server.url, timeout=30) as alice,
        httpx.Client(base_url=server.url, timeout=30) as bob,
    ):
        open_link(bob, privacy_link(http, apps.planner_operator, "bob"))
        open_link(alice, privacy_link(http, apps.planner_operator, "alice"))
        bobs = _item_of(bob, "Porto")
        csrf = csrf_of(alice.get("/privacy").text)
        # Bob's item id, from Alice's session: as an item that does not exist.
        assert alice.get("/privacy/erase", params={"item_id": bobs}).status_code == 404
        refused = alice.post(
            "/privacy/erase", data={"csrf": csrf, "item_id": bobs, "confirm": "yes"}
        )
        assert refused.status_code == 422 and "Porto" not in refused.text
        assert f'data-item="{bobs}"' in bob.get("/privacy").text  # still there
        # A session cookie is one kind: Alice's is no console session, and the other way.
        user = alice.cookies[USER_COOKIE]
        as_console = httpx.get(
            f"{server.url}/console",
            headers={"Cookie": f"{OPERATOR_COOKIE}={user}"},
            follow_redirects=False,
        )
        assert as_console.status_code == 303
        assert as_console.headers["location"] == "/console/login"
    with httpx.Client(base_url=server.url, timeout=30) as console:
        console.post("/console/login", data={"api_key": apps.planner_operator})
        operator = console.cookies[OPERATOR_COOKIE]
        as_user = httpx.get(
            f"{server.url}/privacy", headers={"Cookie": f"{USER_COOKIE}={operator}"}
        )
        assert as_user.status_code == 401


def test_the_sign_in_page_escapes_what_the_link_carries_and_runs_no_script(
    server: LiveServer,
) -> None:
    hostile = '"><script>alert(1)</script>'
    page = httpx.get(f"{server.url}/privacy/login", params={"token": hostile})
    assert page.status_code == 200
    assert "<script>" not in page.text and "&lt;script&gt;" in page.text
    policy = page.headers["content-security-policy"]
    assert "script-src 'none'" in policy and "frame-ancestors 'none'" in policy
    assert page.headers["referrer-policy"] == "no-referrer"
    # The token went back into the form, escaped; posting it is no link.
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.post("/privacy/login", data={"token": hostile}).status_code == 403
        assert USER_COOKIE not in client.cookies
