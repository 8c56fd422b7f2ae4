"""A privacy-center page that waits for the subject's views shows nothing once the key
that issued its sign-in link was revoked during the wait (SQLite and PostgreSQL, a live
server).

A session's link issuer is asked when a page is asked for (a revoked issuer ends the
session at its next page). The profile page, an item's erasure confirmation and the
export then wait for the views, up to ``read_wait_timeout_s``: until 2026-12-05 a key
revoked during that wait (``uprof apps revoke``, another process) still had the page
served, the whole profile, and recorded as read. The door asks the issuer again after the
read, as it asks an API key (decision 0106-profile-reads-decided-after-the-wait).
"""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import Apps, LiveServer
from tests.api.test_consent_withdraw_wait_revocation import during_wait_number
from tests.api.test_profile_wait_revocation import during_the_wait
from tests.api.test_slice_wait_revocation import revoke_elsewhere
from tests.web.conftest import csrf_of, lisbon_item, open_link, privacy_link
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.settings import Settings


def _recorded(kernel: Uprof) -> int:
    kernel.reads.drain()
    return sum(
        1
        for e in kernel.audit_log.entries()
        if e.entry["action"] in ("subject.read", "subject.exported")
    )


@pytest.mark.parametrize("page", ["/privacy", "/privacy/erase", "/privacy/export.json"])
def test_a_page_whose_link_issuer_was_revoked_during_the_wait_shows_nothing(
    page: str,
    server: LiveServer,
    http: httpx.Client,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    apps: Apps,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    item = lisbon_item(http, apps, kernel).item_id
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issuer = keys.create("app:planner", ["app", "operator"])
    params = {"item_id": item} if page == "/privacy/erase" else {}
    with httpx.Client(base_url=server.url, timeout=30) as user:
        open_link(user, privacy_link(http, issuer.token, "alice"))
        shown = user.get(page, params=params)
        assert shown.status_code == 200 and "Lisbon" in shown.text  # the issuer stands
        before = _recorded(kernel)
        waited = during_the_wait(
            kernel, monkeypatch, revoke_elsewhere(settings, keys, issuer.info.key_id, clock)
        )

        refused = user.get(page, params=params)

        assert waited == [True]
        assert refused.status_code == 403, refused.text[-2000:]
        assert "Lisbon" not in refused.text
        assert _recorded(kernel) == before


@pytest.mark.parametrize("wait", [1, 2])
def test_a_withdrawal_with_erase_whose_link_issuer_was_revoked_during_the_wait_erases_nothing(
    server: LiveServer,
    http: httpx.Client,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    apps: Apps,
    monkeypatch: pytest.MonkeyPatch,
    wait: int,
) -> None:
    """The privacy center's "withdraw and erase" reads the consents through the views (a
    wait) before it erases: an issuer revoked during that wait ends it there (review of
    0108/0109; it erased, with a receipt, for a session whose key no longer stood); so
    does one revoked during the kernel's own wait after it (2; hostile callers round 9,
    bug QV: it withdrew and erased)."""
    consent_id = lisbon_item(http, apps, kernel).consent_id
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issuer = keys.create("app:planner", ["app", "operator"])
    with httpx.Client(base_url=server.url, timeout=30) as user:
        open_link(user, privacy_link(http, issuer.token, "alice"))
        page = user.get("/privacy")
        assert page.status_code == 200
        waited = during_wait_number(
            kernel, monkeypatch, wait, revoke_elsewhere(settings, keys, issuer.info.key_id, clock)
        )

        refused = user.post(
            "/privacy/consents/withdraw",
            data={"csrf": csrf_of(page.text), "consent_id": consent_id, "erase": "1"},
        )

        assert len(waited) >= wait, waited
        assert refused.status_code == 403, refused.text[-2000:]
        actions = [e.entry["action"] for e in kernel.audit_log.entries()]
        assert not [a for a in actions if "withdraw" in a or "eras" in a], actions
        assert [c.consent_id for c in kernel.consents_in_force("alice")] == [consent_id]
