"""The console's pages count against the operator key's REST rate limit (SQLite and
PostgreSQL, a live server).

``UPROF_RATE_LIMIT`` (decision 0029) bounds the requests of each API key, and decision
0109 bounded privacy-center sessions. A console session is an operator key signed in:
found in the review of 0108/0109, its pages were counted by neither, so with a limit set
the same key read the audit log through the console without bound, each page appending an
``audit.read`` entry, while its REST calls got 429. The console now counts each page
against the key's allowance; over it, a 429 page with ``Retry-After`` that reads and
records nothing.
"""

from __future__ import annotations

import httpx

from tests.api.conftest import LOOPBACK_TLS, PLANNER, LiveServer, bearer
from tests.web.conftest import console_cookie
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.server import create_server
from uprof.web.pages import OPERATOR_COOKIE

PAGES = 3


def _entries(kernel: Uprof) -> int:
    kernel.reads.drain()
    return sum(1 for _ in kernel.audit_log.entries())


def test_console_pages_over_the_keys_limit_get_a_429_page_and_nothing_is_recorded(
    kernel: Uprof, keys: ApiKeyStore
) -> None:
    operator = keys.create(PLANNER, ["app", "operator"]).token
    with (
        LiveServer(create_server(kernel, keys, rate_limit=f"{PAGES}/minute")) as live,
        httpx.Client(base_url=live.url, timeout=30, verify=LOOPBACK_TLS) as browser,
    ):
        browser.cookies.set(OPERATOR_COOKIE, console_cookie(browser, operator))
        # The sign-in counted as one (hostile callers round 5): PAGES - 1 pages are left.
        for _ in range(PAGES - 1):
            assert browser.get("/console").status_code == 200
        before = _entries(kernel)

        over = browser.get("/console", params={"subject": "alice"})

        assert over.status_code == 429, over.text[-2000:]
        # The window is counted in slots of 1/60 of the period, on the safe side: the
        # wait may be one slot (a second of a minute) longer than the period.
        assert 1 <= int(over.headers["Retry-After"]) <= 61
        assert _entries(kernel) == before  # nothing read, nothing recorded
        # One allowance per key: its REST calls are over it too.
        rest = browser.post("/v1/consents/list", headers=bearer(operator), json={"subject": "a"})
        assert rest.status_code == 429, rest.text
