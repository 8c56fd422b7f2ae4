"""The web pages' security rules over plain HTTP, on SQLite and on PostgreSQL (no browser)."""

from __future__ import annotations

import re

import httpx

from audit.receipts import verify_receipt
from tests.api.conftest import Apps, LiveServer, bearer, grant, interaction
from tests.web.conftest import csrf_of
from uprof.kernel import Uprof


def test_links_sessions_csrf_and_roles(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    consent_id = grant(http, apps.planner, subject="alice")
    grant(http, apps.planner, subject="bob")

    # Issuing a link needs an operator key, and a subject that exists.
    assert http.post("/v1/privacy/links", json={"subject": "alice"}).status_code == 401
    refused = http.post(
        "/v1/privacy/links", headers=bearer(apps.planner), json={"subject": "alice"}
    )
    assert refused.status_code == 403, refused.text
    missing = http.post(
        "/v1/privacy/links", headers=bearer(apps.planner_operator), json={"subject": "nobody"}
    )
    assert missing.status_code == 404
    issued = http.post(
        "/v1/privacy/links", headers=bearer(apps.planner_operator), json={"subject": "alice"}
    )
    assert issued.status_code == 201, issued.text
    login_path = issued.json()["login_path"]

    with httpx.Client(base_url=server.url, timeout=30) as browser:
        opened = browser.get(login_path)
        assert opened.status_code == 200
        cookie = opened.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert issued.json()["token"] not in cookie
        # Single use, whoever presents it.
        assert httpx.get(server.url + login_path).status_code == 403

        home = browser.get("/privacy", params={"subject": "bob"})
        assert home.status_code == 200
        assert consent_id in home.text  # alice's consent, whatever the URL says
        csrf = csrf_of(home.text)

        # No CSRF token, or another session's: nothing changes.
        assert (
            browser.post("/privacy/consents/withdraw", data={"consent_id": consent_id}).status_code
            == 403
        )
        assert (
            browser.post(
                "/privacy/consents/withdraw", data={"consent_id": consent_id, "csrf": "x" * 32}
            ).status_code
            == 403
        )
        ok = http.post(
            "/v1/captures",
            headers=bearer(apps.planner),
            json={"subject": "alice", **interaction("I live in Lisbon")},
        )
        assert ok.status_code == 201, ok.text

        # Erasing one item: confirmation required, then a receipt, and the item is gone.
        page = browser.get("/privacy").text
        item = re.search(r'data-item="([^"]+)"', page)
        assert item and "Lisbon" in page
        confirm = browser.get("/privacy/erase", params={"item_id": item.group(1)})
        assert confirm.status_code == 200 and "Confirm erasure" in confirm.text
        unconfirmed = browser.post("/privacy/erase", data={"csrf": csrf, "item_id": item.group(1)})
        assert unconfirmed.status_code == 400
        erased = browser.post(
            "/privacy/erase", data={"csrf": csrf, "item_id": item.group(1), "confirm": "yes"}
        )
        assert erased.status_code == 303 and erased.headers["location"] == "/privacy/receipts"
        receipt = browser.get("/privacy/receipts/0/receipt.json").json()
        verify_receipt(receipt, kernel.audit_log.public_key)
        assert f'data-item="{item.group(1)}"' not in browser.get("/privacy").text

        done = browser.post(
            "/privacy/consents/withdraw",
            data={"consent_id": consent_id, "csrf": csrf, "subject": "bob"},
        )
        assert done.status_code == 303, done.text  # back to /privacy
        refused_capture = http.post(
            "/v1/captures",
            headers=bearer(apps.planner),
            json={"subject": "alice", **interaction("I like jazz")},
        )
        assert refused_capture.status_code == 403
        # bob's consent (a form field naming bob was ignored) still holds.
        assert (
            http.post(
                "/v1/captures",
                headers=bearer(apps.planner),
                json={"subject": "bob", **interaction("I like jazz")},
            ).status_code
            == 201
        )

    # The console: no session -> sign in; an app key -> 403; an operator key -> in.
    with httpx.Client(base_url=server.url, timeout=30) as console:
        assert console.get("/console", follow_redirects=False).status_code == 303
        assert console.post("/console/login", data={"api_key": "upk_nope"}).status_code == 401
        assert console.post("/console/login", data={"api_key": apps.planner}).status_code == 403
        assert console.get("/console/policy", follow_redirects=False).status_code == 303
        signed = console.post("/console/login", data={"api_key": apps.planner_operator})
        assert signed.status_code == 303 and signed.headers["location"] == "/console"
        assert "Audit trail" in console.get("/console").text
        assert console.get("/console/policy").status_code == 200
        trail = console.get("/console/audit/export", params={"format": "csv"})
        assert trail.status_code == 200 and trail.text.startswith("kind,")
