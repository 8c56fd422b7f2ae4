"""A privacy-center link, and the session opened with it, die with the key that issued it.

The operator key that asks for a sign-in link receives the token. Until 2026-12-05 a link
stayed good for its 15 minutes and the session opened with it for its hour whatever
happened to that key: an operator whose key was revoked could still open, export and
erase the subject's data through a link issued just before (found 2026-12-05). A link now
records the key id that issued it; redeeming it, and every page of the session it opens,
needs that key live (within the key cache's 2 s, as every request with a key).
"""

from __future__ import annotations

import httpx

from tests.api.conftest import PLANNER, LiveServer, grant
from tests.web.conftest import open_link, privacy_link
from uprof.api import ApiKeyStore


def test_a_link_whose_issuing_key_was_revoked_opens_nothing(
    server: LiveServer, http: httpx.Client, keys: ApiKeyStore
) -> None:
    issued = keys.create(PLANNER, ["app", "operator"])
    grant(http, issued.token)
    path = privacy_link(http, issued.token, "alice")
    keys.revoke(issued.info.key_id)
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        open_link(browser, path, expect=403)
        assert browser.get("/privacy").status_code == 401


def test_a_session_ends_when_the_key_that_issued_its_link_is_revoked(
    server: LiveServer, http: httpx.Client, keys: ApiKeyStore
) -> None:
    issued = keys.create(PLANNER, ["app", "operator"])
    grant(http, issued.token)
    other = keys.create(PLANNER, ["app", "operator"])
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        open_link(browser, privacy_link(http, issued.token, "alice"))
        assert browser.get("/privacy").status_code == 200
        keys.revoke(other.info.key_id)  # another key: nothing changes
        assert browser.get("/privacy").status_code == 200
        keys.revoke(issued.info.key_id)
        assert browser.get("/privacy").status_code == 401
        assert browser.get("/privacy/export.json").status_code == 401
