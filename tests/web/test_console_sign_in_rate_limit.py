"""Console sign-ins count against the key's rate limit (hostile callers, round 5; SQLite
and PostgreSQL, a live server).

Every console sign-in with a known key appends an audit entry (``console.signed_in``, or
``console.sign_in_refused`` for a key without the operator role; decision 0103), and the
console's pages count against the key's ``UPROF_RATE_LIMIT`` allowance (review of
0108/0109). The sign-in itself was counted by nothing: any app's key, over its limit on
REST, MCP and the console's pages, posted its own key to ``/console/login`` as often as it
liked and each post wrote an entry to the audit log (found in review: 6 posts under
``2/minute`` were all answered, 403 or 303, and wrote 6 entries). A sign-in is now counted
against the key, once the key is known (an unknown key names no allowance and records
nothing); over it, a 429 page that records nothing.
"""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import LOOPBACK_TLS, PLANNER, LiveServer, bearer
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.server import create_server

LIMIT = 2
POSTS = 6


def _sign_ins(kernel: Uprof) -> int:
    kernel.reads.drain()
    return sum(
        1
        for e in kernel.audit_log.entries()
        if e.entry.get("action") in ("console.signed_in", "console.sign_in_refused")
    )


@pytest.mark.parametrize("roles", [["app"], ["app", "operator"]], ids=["app-key", "operator"])
def test_console_sign_ins_over_the_keys_limit_are_refused_and_record_nothing(
    kernel: Uprof, keys: ApiKeyStore, roles: list[str]
) -> None:
    key = keys.create(PLANNER, roles).token
    with (
        LiveServer(create_server(kernel, keys, rate_limit=f"{LIMIT}/minute")) as live,
        httpx.Client(base_url=live.url, timeout=30, verify=LOOPBACK_TLS) as browser,
    ):
        answers = [
            browser.post("/console/login", data={"api_key": key}, follow_redirects=False)
            for _ in range(POSTS)
        ]
        rest = browser.post("/v1/consents/list", headers=bearer(key), json={"subject": "a"})
    statuses = [a.status_code for a in answers]
    assert statuses[LIMIT:] == [429] * (POSTS - LIMIT), statuses
    assert 1 <= int(answers[-1].headers["Retry-After"]) <= 61
    assert _sign_ins(kernel) == LIMIT, statuses  # the refused sign-ins recorded nothing
    assert rest.status_code == 429, rest.text  # one allowance per key
