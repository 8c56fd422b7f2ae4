"""Attacks on the web pages that held in the review of 2026-12-05 (round 3), kept as
tests: over plain HTTP against a live server, SQLite and PostgreSQL."""

from __future__ import annotations

import re

import httpx

from tests.api.conftest import Apps, LiveServer, bearer, build_kernel, grant, interaction
from tests.web.conftest import csrf_of, open_link, privacy_link
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.server import create_server
from uprof.settings import Settings
from uprof.web.pages import OPERATOR_COOKIE, USER_COOKIE


def _item_of(browser: httpx.Client, kernel: Uprof, text: str) -> str:
    # The server's pipeline extracts in the background: once it has caught up with the
    # log (a generous bound, not a count of looks), the item is on the page or never.
    assert kernel.wait_until_caught_up(120), kernel.lag()
    page = browser.get("/privacy").text
    found = re.search(r'data-item="([^"]+)"', page)
    assert found and text in page, f"no item with {text!r} on the page"
    return found.group(1)


def test_a_session_reaches_no_item_and_no_page_of_another_subject(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof
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
        bobs = _item_of(bob, kernel, "Porto")
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


def test_a_session_cookie_of_one_tenant_opens_nothing_on_another(
    server: LiveServer, http: httpx.Client, apps: Apps, settings: Settings, keys: ApiKeyStore
) -> None:
    """Tenants on one set of stores share the key folder; the cookie's signature names its
    tenant (hostile callers round 7, bug HJ: before, it held on both, and only the key the
    cookie names, unknown to the other tenant, refused the session; a key of no tenant
    did not). Bob is unknown there, so the subject's incarnation alone would not refuse
    the privacy-center cookie; the console cookie is no session (back to sign-in)."""
    grant(http, apps.planner, subject="bob")
    with httpx.Client(base_url=server.url, timeout=30) as here:
        open_link(here, privacy_link(http, apps.planner_operator, "bob"))
        user = here.cookies[USER_COOKIE]
        here.post("/console/login", data={"api_key": apps.planner_operator})
        operator = here.cookies[OPERATOR_COOKIE]
        assert here.get("/privacy").status_code == 200
    there = settings.model_copy(update={"tenant": "other-tenant"})
    other_kernel = build_kernel(there)
    other_keys = ApiKeyStore.open(there)
    try:
        with LiveServer(create_server(other_kernel, other_keys)) as other:
            privacy = httpx.get(f"{other.url}/privacy", headers={"Cookie": f"{USER_COOKIE}={user}"})
            assert privacy.status_code == 401, privacy.text
            console = httpx.get(
                f"{other.url}/console",
                headers={"Cookie": f"{OPERATOR_COOKIE}={operator}"},
                follow_redirects=False,
            )
            assert console.status_code == 303, console.text
            assert console.headers["location"] == "/console/login"
    finally:
        other_keys.close()
        other_kernel.close()
