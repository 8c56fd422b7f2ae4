"""When the rate-limit counters cannot be read, requests are refused, not let through
uncounted (SQLite and PostgreSQL, a live server): REST and console get 503
``rate_limit_unavailable`` with ``Retry-After``, a privacy-center page a 503 page; nothing
is read or recorded. Once the counters answer again, requests are served."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.api.conftest import Apps, LiveServer, bearer, grant
from tests.conftest import Backend
from tests.web.conftest import open_link, privacy_link
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.server import create_server
from uprof.storage import create_engine


def _entries(kernel: Uprof) -> list[dict[str, Any]]:
    kernel.reads.drain()
    return [e.entry for e in kernel.audit_log.entries()]


def _unreachable(backend: Backend, tmp_path: Path) -> sa.Engine:
    """An engine of the backend's kind on a database that does not answer."""
    if backend.kind == "postgres":
        return create_engine("postgresql+psycopg://postgres@127.0.0.1:1/nowhere?connect_timeout=2")
    return create_engine(f"sqlite:///{tmp_path / 'no-such-folder' / 'views.sqlite'}")


def test_requests_the_counters_cannot_count_are_refused_with_503(
    kernel: Uprof,
    keys: ApiKeyStore,
    apps: Apps,
    backend: Backend,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counters = kernel.rate_counters
    assert counters is not None
    with (
        LiveServer(create_server(kernel, keys, rate_limit="100/minute")) as live,
        httpx.Client(base_url=live.url, timeout=30) as http,
        httpx.Client(base_url=live.url, timeout=30) as user,
    ):
        grant(http, apps.planner)
        open_link(user, privacy_link(http, apps.planner_operator, "alice"))
        assert user.get("/privacy").status_code == 200
        before = _entries(kernel)

        broken = _unreachable(backend, tmp_path)
        working = counters._engine
        monkeypatch.setattr(counters, "_engine", broken)
        try:
            refused = http.post(
                "/v1/consents/list", headers=bearer(apps.planner), json={"subject": "alice"}
            )
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "rate_limit_unavailable"
            assert int(refused.headers["Retry-After"]) >= 1

            page = user.get("/privacy")
            assert page.status_code == 503, page.text
            assert "Service unavailable" in page.text
            assert "app:planner" not in page.text  # the profile is not shown
            assert int(page.headers["Retry-After"]) >= 1
            assert _entries(kernel) == before  # nothing read, nothing recorded
        finally:
            monkeypatch.setattr(counters, "_engine", working)
            broken.dispose()

        served = http.post(
            "/v1/consents/list", headers=bearer(apps.planner), json={"subject": "alice"}
        )
        assert served.status_code == 200, served.text
        assert user.get("/privacy").status_code == 200
