"""The compliance console while the policy store does not answer (review of 0186 and
0188), on SQLite and PostgreSQL: every page the policy decides refuses naming the
outage (403 or 503, never 200 with rows left out, never 500); the public key and the
verify form, which the policy does not decide, still answer (OV's fix made the REST key
refuse, and must not take the public key from a verifier)."""

from __future__ import annotations

import re

import httpx

from tests.api.conftest import Apps, LiveServer, grant
from tests.conftest import Backend
from tests.web.conftest import console_cookie, csrf_of, policy_store_down
from uprof.kernel import Uprof
from uprof.web.pages import OPERATOR_COOKIE

OUTAGE = "policy store unreadable"


def _words(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def test_the_console_refuses_what_the_policy_decides_and_still_hands_out_the_key(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof, backend: Backend
) -> None:
    """Held: the audit search, receipts, export, residue scan and a policy change are
    refused naming the outage; the policy page says the store is unreadable and shows no
    rule (none is in force); the key download and the verify form answer 200."""
    grant(http, apps.planner)
    with httpx.Client(base_url=server.url, timeout=60) as browser:
        browser.cookies.set(OPERATOR_COOKIE, console_cookie(browser, apps.planner_operator))
        csrf = csrf_of(browser.get("/console/receipts").text)
        assert "role:assistant" in _words(browser.get("/console/policy").text)  # in force
        form = {"Origin": server.url}
        with policy_store_down(backend, kernel):
            refused = [
                browser.get("/console"),
                browser.get("/console/receipts"),
                browser.get("/console/audit/export"),
                browser.post("/console/residue", data={"csrf": csrf, "terms": "x"}, headers=form),
                browser.post(
                    "/console/policy/grant",
                    data={"csrf": csrf, "app": "app:x", "role": "role:assistant"},
                    headers=form,
                ),
            ]
            policy = browser.get("/console/policy")
            key = browser.get("/console/public-key.pem")
            verify = browser.get("/console/verify")
    for answer in refused:
        assert answer.status_code in (403, 503), (answer.url, answer.status_code)
        assert OUTAGE in _words(answer.text), (answer.url, _words(answer.text)[:300])
    assert "Policy store unreadable" in _words(policy.text)
    assert "role:assistant" not in _words(policy.text)  # no rule shown as in force
    assert key.status_code == 200 and "BEGIN PUBLIC KEY" in key.text, key.text[:300]
    assert verify.status_code == 200, _words(verify.text)[:300]
