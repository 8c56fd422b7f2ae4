"""A privacy-center link or session is for one incarnation of its subject.

Sign-in links and sessions named the subject reference only. An operator may erase a
subject and later re-create the name (``uprof subjects recreate``): the new subject is
unlinkable to the old one (a fresh stream and pseudonym, decision 0012). A session
opened before the erasure, or a link issued before it and opened after the re-creation,
still named the reference, and so showed the new subject's profile to whoever held the
old cookie. Both now carry a tag of the subject they were issued for (a keyed hash of its
pseudonym: a cookie is readable by its holder, and the pseudonym itself would link the name
to the subject's audit entries); another tag (or none) is no session (401) and no link (403).
"""

from __future__ import annotations

import json

import httpx
from itsdangerous import URLSafeTimedSerializer

from tests.api.conftest import Apps, LiveServer, bearer, grant, interaction
from tests.web.conftest import open_link
from uprof.kernel import Uprof
from uprof.web.pages import USER_COOKIE


def issue_link(http: httpx.Client, apps: Apps, subject: str) -> str:
    issued = http.post(
        "/v1/privacy/links", headers=bearer(apps.planner_operator), json={"subject": subject}
    )
    assert issued.status_code == 201, issued.text
    return str(issued.json()["login_path"])


def capture(http: httpx.Client, apps: Apps, text: str) -> None:
    done = http.post(
        "/v1/captures", headers=bearer(apps.planner), json={"subject": "alice", **interaction(text)}
    )
    assert done.status_code == 201, done.text


def test_a_session_or_link_of_an_erased_subject_opens_nothing_of_the_re_created_one(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    grant(http, apps.planner, subject="alice")
    capture(http, apps, "I live in Lisbon")
    unused_link = issue_link(http, apps, "alice")

    with httpx.Client(base_url=server.url, timeout=60) as old_browser:
        open_link(old_browser, issue_link(http, apps, "alice"))
        assert "Lisbon" in old_browser.get("/privacy").text

        kernel.erase_subject("alice")
        kernel.recreate_subject("alice")
        grant(http, apps.planner, subject="alice")
        capture(http, apps, "I live in Porto")
        kernel.ensure_fresh(30)

        with httpx.Client(base_url=server.url, timeout=60) as new_browser:
            open_link(new_browser, issue_link(http, apps, "alice"))
            assert "Porto" in new_browser.get("/privacy").text  # the check can fail

        stale = old_browser.get("/privacy")
        assert "Porto" not in stale.text and stale.status_code == 401
        with httpx.Client(base_url=server.url, timeout=60) as late_browser:
            open_link(late_browser, unused_link, expect=403)
            assert "Porto" not in late_browser.get("/privacy").text


def test_a_session_cookie_does_not_hold_the_subjects_pseudonym(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    grant(http, apps.planner, subject="alice")
    pseudonym = kernel.subject_pseudonym("alice")
    assert pseudonym
    with httpx.Client(base_url=server.url, timeout=60) as browser:
        open_link(browser, issue_link(http, apps, "alice"))
        cookie = browser.cookies[USER_COOKIE]
        _, fields = URLSafeTimedSerializer(b"any key: the payload is only signed").loads_unsafe(
            cookie
        )
        assert isinstance(fields, dict) and fields["subject"] == "alice"  # it was read
        assert pseudonym not in json.dumps(fields) and pseudonym not in cookie
        assert browser.get("/privacy").status_code == 200
