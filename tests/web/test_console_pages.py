"""The console shows lists a page at a time with a "Next page" link (no "first 500"), on
SQLite and PostgreSQL; a forged cursor in the URL is refused, not widened."""

from __future__ import annotations

import html
import re

import httpx
import pytest

from tests.api.conftest import Apps, LiveServer, bearer, grant, interaction


def _next_link(page: str) -> str | None:
    found = re.search(r'<a href="([^"]+)" rel="next">', page)
    return html.unescape(found.group(1)) if found else None


def _leaves(page: str) -> list[int]:
    return [int(n) for n in re.findall(r"<tr><td>(\d+)</td>", page)]


def test_the_audit_page_follows_next_links_over_the_whole_trail(
    server: LiveServer, http: httpx.Client, apps: Apps, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uprof.web.console_audit as console_audit

    monkeypatch.setattr(console_audit, "CONSOLE_PAGE_ROWS", 4)
    grant(http, apps.planner)
    for i in range(6):
        r = http.post(
            "/v1/captures",
            headers=bearer(apps.planner),
            json={"subject": "alice", **interaction(f"line {i}")},
        )
        assert r.status_code == 201
    with httpx.Client(base_url=server.url, timeout=30) as console:
        console.post("/console/login", data={"api_key": apps.planner_operator})
        url: str | None = "/console?action=capture.accepted"
        seen: list[int] = []
        pages = 0
        while url is not None:
            page = console.get(url)
            assert page.status_code == 200, page.text
            assert "first" not in page.text.split("<caption>")[1].split("</caption>")[0]
            seen += _leaves(page.text)
            url = _next_link(page.text)
            if url:
                assert "action=capture.accepted" in url  # the filter stays with the cursor
            pages += 1
        assert pages == 2 and len(seen) == 6 and seen == sorted(set(seen))

        forged_cursor = "c1.WzBd.AAAAAAAAAAAAAAAAAAAAAA"
        forged = console.get(f"/console?action=capture.accepted&cursor={forged_cursor}")
        assert "cursor" in forged.text and _leaves(forged.text) == []
        # A cursor of the filtered search used without its filter is refused too.
        first = console.get("/console?action=capture.accepted").text
        cursor_only = (_next_link(first) or "").split("cursor=")[1]
        assert _leaves(console.get(f"/console?cursor={cursor_only}").text) == []


def test_the_receipts_page_pages(
    server: LiveServer, http: httpx.Client, apps: Apps, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uprof.web.console_receipts as console_receipts

    monkeypatch.setattr(console_receipts, "CONSOLE_PAGE_ROWS", 1)
    for name in ("alice", "bob"):
        grant(http, apps.planner, subject=name)
        erased = http.post(
            "/v1/governance/erasures/subject", headers=bearer(apps.privacy), json={"subject": name}
        )
        assert erased.status_code == 200, erased.text
    with httpx.Client(base_url=server.url, timeout=30) as console:
        console.post("/console/login", data={"api_key": apps.planner_operator})
        first = console.get("/console/receipts").text
        later = _next_link(first)
        assert later is not None
        second = console.get(later).text
        ids = re.findall(r"<td><code>([0-9a-f-]{36})</code></td>", first + second)
        assert len(set(ids)) == 2
        assert _next_link(second) is None
