"""Review of decision 0173 (hostile callers, round 8) as an outside attacker, on SQLite and
PostgreSQL against a live server: each test failed on main (4bf158b) before its fix."""

from __future__ import annotations

import time

import httpx
import pytest

from domain.errors import InvalidInputError
from domain.principal import Principal
from tests.api.conftest import Apps, LiveServer, grant
from tests.conftest import Backend
from tests.policies.test_policy_store import _rename_policy_table
from tests.web.conftest import link_token, open_link, policy_store_down, privacy_link
from uprof.facade import Facade
from uprof.kernel import Uprof


def test_a_policy_store_outage_is_503_with_retry_after(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof, backend: Backend
) -> None:
    """Bug MF: ``PolicyStoreError`` had no row in the status table, so a privacy-center
    page refused for an unreadable policy store (0173's outage branch) answered 500
    "internal", logged as a server fault, with no ``Retry-After``; REST's policy routes
    mapped the same error by hand to 503 without one. An outage is temporary: the table
    now says 503 ``policy_store_unavailable`` with ``Retry-After`` for every surface (REST,
    MCP, the SDK's embedded mode, the pages), and the page keeps the session (0173)."""
    from uprof.api.errors import classify, retry_after_s
    from uprof.facade import PolicyStoreError

    outage = PolicyStoreError("policy store unreadable (OperationalError)")
    assert classify(outage) == (503, "policy_store_unavailable")
    assert (retry_after_s(outage) or 0) > 0
    grant(http, apps.planner)
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        open_link(browser, privacy_link(http, apps.planner_operator, "alice"))
        assert browser.get("/privacy/export.json").status_code == 200
        with policy_store_down(backend, kernel):
            for path in ("/privacy/export.json", "/privacy", "/privacy/receipts"):
                page = browser.get(path)
                assert page.status_code == 503, (path, page.status_code, page.text[:300])
                assert int(page.headers["Retry-After"]) > 0, path
                assert "policy store unreadable" in page.text and "consents" not in page.text
        assert browser.get("/privacy/export.json").status_code == 200


def test_a_sign_in_during_a_policy_store_outage_does_not_burn_the_link(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof, backend: Backend
) -> None:
    """Bug MG: at sign-in the link was redeemed (burned) before 0173's policy check, so a
    subject pressing "Sign in" while the policy store could not be read got the outage's
    refusal and a used link: once the store answered, the same link said "Link not
    valid", and only an operator could help (a new link), the outage signing the subject
    out for good, which 0173 keeps from happening to an open session. Refused for the
    outage, the link is handed back unused and signs in once the store answers."""
    grant(http, apps.planner)
    login = privacy_link(http, apps.planner_operator, "alice")
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        token = link_token(browser, login)
        with policy_store_down(backend, kernel):
            refused = browser.post("/privacy/login", data={"token": token})
            assert refused.status_code >= 500, refused.text[:300]
            assert "policy store unreadable" in refused.text
            assert browser.get("/privacy/export.json").status_code == 401
        signed = browser.post("/privacy/login", data={"token": token})
        assert signed.status_code == 303, signed.text[:300]
        assert browser.get("/privacy/export.json").status_code == 200
        # Still single-use: the session took it.
        again = browser.post("/privacy/login", data={"token": token})
        assert again.status_code == 403 and "Link not valid" in again.text


def test_a_page_just_after_a_policy_store_outage_keeps_the_session(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof, backend: Backend
) -> None:
    """Bug MH: the link's check asked the policy (which answers from its last look at the
    store for ``policy_refresh_s``), and only on a denial asked the store's health, which
    looks now. A page in the window after the store came back got the cached outage's
    denial, then a healthy store: taken for the policy's refusal, the session was ended
    for good by an outage that was over, and an ``access.denied`` written for it. The
    link is now decided again once the store answers."""
    grant(http, apps.planner)
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        open_link(browser, privacy_link(http, apps.planner_operator, "alice"))
        assert browser.get("/privacy/export.json").status_code == 200
        # Widen the window the store's last look is trusted (0.25 s by default), so the
        # page below surely falls in it.
        kernel.authorizer.refresh_s = 3600.0
        try:
            _rename_policy_table(backend, kernel.settings)
            try:
                assert "policy store unreadable" in kernel.policy_health()
            finally:
                _rename_policy_table(backend, kernel.settings, back=True)
            kernel.reads.drain()
            before = _denials(kernel)
            page = browser.get("/privacy/export.json")
            assert page.status_code == 200, (page.status_code, page.text[:300])
            kernel.reads.drain()
            assert _denials(kernel) == before
            assert browser.get("/privacy").status_code == 200
        finally:
            kernel.authorizer.refresh_s = 0.25


def _denials(kernel: Uprof) -> int:
    return sum(1 for e in kernel.audit_log.entries() if e.entry["action"] == "access.denied")


@pytest.mark.parametrize("blank", ["", " ", "\t\n"])
def test_a_residue_scan_refuses_a_blank_term_naming_terms(kernel: Uprof, blank: str) -> None:
    """Bug ME: the door counted the residue scan's terms (0173, LS) but took an empty or
    blank one: on PostgreSQL an empty term is in every value (``position('' in x)`` is 1),
    so the CLI's ``uprof audit residue --term ""`` (a script's empty variable) reported
    every row of every table as residue; a blank term (a space) was found in nearly every
    file on both backends. The console dropped blank lines, the CLI did not: the door now
    refuses a blank term, naming ``terms`` and its place, before anything is read."""
    door = Facade(kernel, Principal.local_operator(kernel.subjects.tenant))
    clean = door.residue_scan(["Zq7-never-said"])
    assert clean.clean, clean.findings[:3]
    with pytest.raises(InvalidInputError) as refused:
        door.residue_scan(["Zq7-never-said", blank])
    assert refused.value.field == "terms"
    assert "terms[1]" in str(refused.value)


def _deny_operators_in_child(settings_json: str, action: str, purpose: str) -> None:
    from tests.api.conftest import build_kernel
    from tests.web.conftest import deny_operators
    from uprof.settings import Settings

    other = build_kernel(Settings.model_validate_json(settings_json))
    try:
        deny_operators(other, action, purpose)
    finally:
        other.close()


def test_a_policy_change_by_another_process_ends_an_open_privacy_session(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    """Held (0173, LQ, many processes): a session is open on this server; another real
    process (a second deployment's kernel on the same stores, as the CLI is) denies the
    operators ``export``. Within the policy's refresh bound (decision 0015) this server
    decides the link on the policy the other process wrote: the next page is refused and
    the session ends, the refusal audited under the link's principal."""
    from tests import children

    grant(http, apps.planner)
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        open_link(browser, privacy_link(http, apps.planner_operator, "alice"))
        assert browser.get("/privacy/export.json").status_code == 200
        child = children.CONTEXT.Process(
            target=_deny_operators_in_child,
            args=(kernel.settings.model_dump_json(), "export", "access-request"),
        )
        child.start()
        child.join(120)
        assert child.exitcode == 0
        time.sleep(kernel.settings.policy_refresh_s * 2)
        ended = browser.get("/privacy/export.json")
        assert ended.status_code == 401, ended.text[:300]
        assert "consents" not in ended.text
    kernel.reads.drain()
    last = [e.entry for e in kernel.audit_log.entries() if e.entry["action"] == "access.denied"]
    assert last and last[-1]["principal"].startswith("privacy-center#")
    assert last[-1]["reason_code"] == "export"
