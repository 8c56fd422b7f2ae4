"""A privacy-center session is rate limited, keyed by the link that opened it (SQLite and
PostgreSQL, a live server).

Each page that shows the subject's data appends a ``subject.read`` entry (decision 0102),
and the rate limit (``UPROF_RATE_LIMIT``, decision 0029) counted API keys only: a session
holder could grow the audit log by reloading, as fast as the server answered, for the
hour the session lasts (security.md, review of 0102). Sessions are now counted against
``privacy_rate_limit``; over it the page is a 429 with ``Retry-After``, and nothing is read
or recorded.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.conftest import Apps, LiveServer, api_settings, grant
from tests.conftest import Backend
from tests.web.conftest import open_link, privacy_link
from uprof.kernel import Uprof
from uprof.settings import Settings

PAGES = 3


@pytest.fixture
def settings(backend: Backend) -> Settings:
    # model_copy: the field is set as given (a tree without it just carries it unused).
    return api_settings(backend, background=True).model_copy(
        update={"privacy_rate_limit": f"{PAGES}/minute"}
    )


def _entries(kernel: Uprof) -> list[dict[str, Any]]:
    kernel.reads.drain()
    return [e.entry for e in kernel.audit_log.entries()]


def test_a_session_over_its_rate_gets_a_429_page_and_nothing_is_recorded(
    server: LiveServer, http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    grant(http, apps.planner)
    with httpx.Client(base_url=server.url, timeout=30) as user:
        open_link(user, privacy_link(http, apps.planner_operator, "alice"))
        for _ in range(PAGES):
            assert user.get("/privacy").status_code == 200
        before = _entries(kernel)

        over = user.get("/privacy")

        assert over.status_code == 429, over.text
        assert "Too many requests" in over.text
        assert int(over.headers["Retry-After"]) >= 1
        assert "app:planner" not in over.text  # the profile (its consent) is not shown
        assert _entries(kernel) == before  # nothing read, nothing recorded

        # Every page of the session is counted: the export (recorded too) is refused alike.
        assert user.get("/privacy/export.json").status_code == 429
        assert _entries(kernel) == before

        # Another link's session has its own allowance.
        with httpx.Client(base_url=server.url, timeout=30) as other:
            open_link(other, privacy_link(http, apps.planner_operator, "alice"))
            assert other.get("/privacy").status_code == 200


def test_a_page_over_the_limit_is_refused_before_the_stores_are_asked(
    server: LiveServer,
    http: httpx.Client,
    kernel: Uprof,
    apps: Apps,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Decision 0109 says the 429 comes "before any door is made": found in its review,
    the session's subject was looked up in the key store (its incarnation) and its
    issuing key asked first, on every refused page too. Refused pages now cost the
    cookie's signature and its sign-out check only."""
    grant(http, apps.planner)
    with httpx.Client(base_url=server.url, timeout=30) as user:
        open_link(user, privacy_link(http, apps.planner_operator, "alice"))
        for _ in range(PAGES):
            assert user.get("/privacy").status_code == 200
        looked_up: list[str] = []
        real = kernel.subject_pseudonym

        def counted(subject: str) -> str | None:
            looked_up.append(subject)
            return real(subject)

        monkeypatch.setattr(kernel, "subject_pseudonym", counted)

        assert user.get("/privacy").status_code == 429
        assert user.post("/privacy/consents/withdraw", data={"csrf": "x"}).status_code == 429
        assert looked_up == []
