"""Rate limits hold across server processes and restarts (SQLite and PostgreSQL, real
``uprof serve`` processes on one database).

The counters of ``UPROF_RATE_LIMIT`` (per API key) and ``UPROF_PRIVACY_RATE_LIMIT`` (per
privacy-center session, keyed by its link) lived in each server process's memory: with
two servers a caller alternating between them got twice the allowance, and a restart
gave a fresh one (security.md, decisions 0109 and 0111). They are now counted in the
deployment's database (decision 0115-shared-rate-limits).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx
import pytest

from benchmarks.reliability import PLANNER, Target, make_settings
from benchmarks.server_ready import popen_serving, stop_server, wait_until_healthy
from tests.conftest import Backend
from uprof.web.pages import USER_COOKIE

#: Requests per key, and pages per privacy session, in the window of an hour: no test
#: runs long enough for an hour's window to move.
KEY_LIMIT = 4
PAGE_LIMIT = 3


@pytest.fixture
def target(backend: Backend) -> Target:
    return Target(
        backend.kind,
        backend.data_dir / "data",
        backend.url if backend.kind == "postgres" else None,
    )


@contextmanager
def _serving(target: Target) -> Iterator[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPROF_")}
    env |= {
        "HF_HUB_OFFLINE": "1",
        "UPROF_DATA_DIR": str(target.data_dir),
        "UPROF_EMBEDDER": "hashing",
        "UPROF_EXTRACTOR": "rules",
        "UPROF_RATE_LIMIT": f"{KEY_LIMIT}/hour",
        "UPROF_PRIVACY_RATE_LIMIT": f"{PAGE_LIMIT}/hour",
    }
    if target.database_url:
        env["UPROF_DATABASE_URL"] = target.database_url
    command = [sys.executable, "-m", "uprof.cli.main", "serve", "--log-level", "warning"]
    proc, port = popen_serving(command, env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(proc, url, timeout_s=120)
        yield url
    finally:
        stop_server(proc)


def _keys(target: Target) -> tuple[str, str]:
    """An app key and an operator key (for the sign-in link) of the planner app."""
    from uprof.api import ApiKeyStore

    keys = ApiKeyStore.open(make_settings(target))
    try:
        return keys.create(PLANNER).token, keys.create(PLANNER, ["app", "operator"]).token
    finally:
        keys.close()


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _sign_in(http: httpx.Client, url: str, operator: str) -> None:
    """A privacy-center session for alice, through a link issued and opened at ``url``
    (links are kept by the server that issued them; the session cookie is good on all)."""
    issued = http.post(
        f"{url}/v1/privacy/links", headers=_bearer(operator), json={"subject": "alice"}
    )
    assert issued.status_code == 201, issued.text
    shown = http.get(f"{url}{issued.json()['login_path']}")
    token = re.search(r'name="token" value="([^"]+)"', shown.text)
    assert token, shown.text
    signed = http.post(f"{url}/privacy/login", data={"token": token.group(1)})
    assert signed.status_code == 303, signed.text


def test_two_servers_share_one_allowance_and_a_restart_keeps_the_window(target: Target) -> None:
    with ExitStack() as started:
        first = started.enter_context(_serving(target))
        planner, operator = _keys(target)
        second = started.enter_context(_serving(target))
        with httpx.Client(timeout=60) as http:
            granted = http.post(
                f"{first}/v1/consents",
                headers=_bearer(planner),
                json={
                    "subject": "alice",
                    "categories": ["*"],
                    "purposes": ["personalization"],
                    "collected_by": "consent-ui:test",
                },
            )
            assert granted.status_code == 201, granted.text

            # The key's requests, alternating between the servers: the grant was one.
            statuses = [
                http.post(
                    f"{url}/v1/consents/list", headers=_bearer(planner), json={"subject": "alice"}
                ).status_code
                for url in [second, first] * 3
            ]
            assert [s == 429 for s in statuses] == [False] * (KEY_LIMIT - 1) + [True] * (
                7 - KEY_LIMIT
            ), statuses

            # A privacy session's pages, alternating between the servers.
            _sign_in(http, first, operator)
            pages = [http.get(f"{url}/privacy").status_code for url in [second, first] * 3]
            assert pages == [200] * PAGE_LIMIT + [429] * (6 - PAGE_LIMIT), pages
            session_cookie = http.cookies[USER_COOKIE]

    # Both servers stopped; a new one on the same database remembers both windows.
    with _serving(target) as again, httpx.Client(timeout=60) as http:
        refused = http.post(
            f"{again}/v1/consents/list", headers=_bearer(planner), json={"subject": "alice"}
        )
        assert refused.status_code == 429, refused.text
        assert 1 <= int(refused.headers["Retry-After"]) <= 3660  # an hour and a slot
        # The session from before the restart (its signed cookie holds on every server).
        http.cookies.set(USER_COOKIE, session_cookie)
        page = http.get(f"{again}/privacy")
        assert page.status_code == 429, page.text
        assert 1 <= int(page.headers["Retry-After"]) <= 3660  # an hour and a slot
