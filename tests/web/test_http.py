"""The web pages' security rules over plain HTTP, on SQLite and on PostgreSQL (no browser)."""

from __future__ import annotations

import asyncio
import re

import httpx

from audit.receipts import verify_receipt
from tests.api.conftest import PLANNER, Apps, LiveServer, bearer, grant, interaction
from tests.web.conftest import csrf_of, open_link
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.server import create_server


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
        opened = open_link(browser, login_path)
        cookie = opened.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert issued.json()["token"] not in cookie
        # Single use, whoever presents it.
        with httpx.Client(base_url=server.url, timeout=30) as other:
            open_link(other, login_path, expect=403)

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
        verify_receipt(receipt, kernel.audit_log.public_key, origin=kernel.audit_log.origin)
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


def _signed_in(server: LiveServer, http: httpx.Client, apps: Apps, subject: str) -> httpx.Client:
    issued = http.post(
        "/v1/privacy/links", headers=bearer(apps.planner_operator), json={"subject": subject}
    )
    assert issued.status_code == 201, issued.text
    browser = httpx.Client(base_url=server.url, timeout=30)
    open_link(browser, issued.json()["login_path"])
    return browser


def test_the_privacy_center_pages_memories_and_refuses_foreign_cursors(
    server: LiveServer, http: httpx.Client, apps: Apps
) -> None:
    from uprof.web.privacy_profile import MEMORIES_PER_PAGE

    grant(http, apps.planner, subject="alice")
    grant(http, apps.planner, subject="bob")
    total = 2 * MEMORIES_PER_PAGE + 7  # all at one instant: the order breaks ties by id
    for n in range(total):
        body = {"subject": "alice", **interaction(f"Note number {n} about the garden")}
        assert http.post("/v1/captures", headers=bearer(apps.planner), json=body).status_code == 201
    http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "bob", **interaction("bob was here")},
    )

    def memory_ids(page: str) -> list[str]:
        section = page.split('id="memories"', 1)[1].split("</section>", 1)[0]
        return re.findall(r'data-item="([^"]+)"', section)

    def next_link(page: str) -> str | None:
        found = re.search(r'<a rel="next" href="([^"]+)"', page)
        return found.group(1).replace("&amp;", "&") if found else None

    alice = _signed_in(server, http, apps, "alice")
    bob = _signed_in(server, http, apps, "bob")
    try:
        seen: list[str] = []
        sizes: list[int] = []
        link: str | None = "/privacy"
        while link is not None:
            page = alice.get(link)
            assert page.status_code == 200, page.text
            ids = memory_ids(page.text)
            sizes.append(len(ids))
            seen += ids
            link = next_link(page.text)
        assert sizes == [MEMORIES_PER_PAGE, MEMORIES_PER_PAGE, 7]
        assert len(seen) == len(set(seen)) == total  # none repeated, none skipped

        second = next_link(alice.get("/privacy").text)
        assert second is not None
        # Another subject's session cannot use alice's cursor: it is bound to her.
        refused = bob.get(second)
        assert refused.status_code == 422 and "garden" not in refused.text
        # An altered cursor is refused too, and names what is wrong.
        cursor = second.split("memories=", 1)[1].split("#", 1)[0]
        # One character surely changed: "AA" put in place of the last two was no change
        # when the tag already ended so (about one cursor in 1,024: a CI run failed so).
        middle = len(cursor) // 2
        changed = "B" if cursor[middle] == "A" else "A"
        altered = cursor[:middle] + changed + cursor[middle + 1 :]
        assert altered != cursor
        tampered = alice.get("/privacy", params={"memories": altered})
        assert tampered.status_code == 422 and "cursor" in tampered.text
    finally:
        alice.close()
        bob.close()


def test_two_apps_in_one_process_keep_their_own_sign_in_links(
    kernel: Uprof, keys: ApiKeyStore, apps: Apps
) -> None:
    """The web routes are built once per process and shared by every app: each app still
    keeps its own sign-in links (a link issued by one app is unknown to another, as when
    each app built its own routes and stores)."""
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    first, second = create_server(kernel, keys), create_server(kernel, keys)

    async def run() -> None:
        async with (
            httpx.AsyncClient(transport=httpx.ASGITransport(app=first), base_url="http://a") as a,
            httpx.AsyncClient(transport=httpx.ASGITransport(app=second), base_url="http://b") as b,
        ):
            issued = await a.post(
                "/v1/privacy/links",
                headers=bearer(apps.planner_operator),
                json={"subject": "alice"},
            )
            assert issued.status_code == 201, issued.text
            token = {"token": issued.json()["token"]}
            assert (await b.post("/privacy/login", data=token)).status_code == 403  # not b's
            opened = await a.post("/privacy/login", data=token)
            assert opened.status_code == 303, opened.text
            assert (await a.post("/privacy/login", data=token)).status_code == 403  # single use

    asyncio.run(run())
