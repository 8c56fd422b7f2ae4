"""Fixtures of the web tests: the live API server of tests/api, and a headless Chromium.

Chromium is Debian's (/usr/bin/chromium, installed by .ci/run), driven by Playwright for
Python through ``executable_path``; Playwright's own browser download is never used.
Browser tests skip only when that binary is absent. With ``UPROF_SCREENSHOTS=1`` they also
save a screenshot of each page to docs/screenshots/.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
import sqlalchemy as sa

from tests.api.conftest import (  # noqa: F401  (fixtures, re-exported for this package)
    Apps,
    LiveServer,
    apps,
    bearer,
    grant,
    http,
    interaction,
    kernel,
    keys,
    server,
    settings,
)
from tests.conftest import Backend
from uprof.kernel import Uprof

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian chromium is not installed at /usr/bin/chromium "
    "(CI installs it: apt-get install chromium chromium-driver)",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="uprof-chromium-") as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            accept_downloads=True,
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh tab with no cookies left from an earlier test."""
    browser.clear_cookies()
    tab = browser.new_page()
    tab.set_default_timeout(20_000)
    try:
        yield tab
    finally:
        tab.close()


def shot(page: Any, name: str) -> None:
    """Save a full-page screenshot when UPROF_SCREENSHOTS=1."""
    if os.environ.get("UPROF_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def privacy_link(client: httpx.Client, operator_key: str, subject: str) -> str:
    response = client.post(
        "/v1/privacy/links", headers=bearer(operator_key), json={"subject": subject}
    )
    assert response.status_code == 201, response.text
    return str(response.json()["login_path"])


def console_cookie(client: httpx.Client, operator_key: str) -> str:
    """Sign in to the console with an operator key; the session cookie it sets."""
    from uprof.web.pages import OPERATOR_COOKIE

    signed = client.post("/console/login", data={"api_key": operator_key}, follow_redirects=False)
    assert signed.status_code == 303, signed.text
    return str(signed.cookies[OPERATOR_COOKIE])


def deny_operators(uprof: Any, action: str, purpose: str, role: str = "role:operator") -> None:
    """Deny every operator ``action`` for ``purpose``, in every category (the policy's
    ``role:operator``, as a deployment narrowing its operators would; or another
    ``role``), on the kernel ``uprof``."""
    uprof.policy_grant(
        requested_by="test",
        role=role,
        actions=[action],
        categories=["any"],
        purpose=purpose,
        effect="deny",
    )


def audit_denied_during_the_scan(uprof: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deny the operators ``audit`` (``deny_operators``) while ``uprof``'s next residue
    scans run: after each has read everything, before its report leaves the kernel."""
    scan = uprof.residue_scan

    def denied_during_the_scan(terms: Any) -> Any:
        report = scan(terms)
        deny_operators(uprof, "audit", "compliance")
        return report

    monkeypatch.setattr(uprof, "residue_scan", denied_during_the_scan)


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, "no CSRF token in the page"
    return match.group(1)


def link_token(client: httpx.Client, login_path: str) -> str:
    """Open a sign-in link's page (a GET: it uses nothing) and read the token its
    **Sign in** form posts back."""
    shown = client.get(login_path)
    assert shown.status_code == 200, shown.text[:300]
    token = re.search(r'name="token" value="([^"]+)"', shown.text)
    assert token, f"no sign-in form on the link's page: {shown.text[:300]}"
    return token.group(1)


def open_link(client: httpx.Client, login_path: str, *, expect: int = 303) -> httpx.Response:
    """Do what a user does with a sign-in link: open it, then press "Sign in" (the form
    posts the link's token back). Returns the answer to that post."""
    return _press_sign_in(client, link_token(client, login_path), expect=expect)


def _press_sign_in(client: httpx.Client, token: str, *, expect: int = 303) -> httpx.Response:
    signed = client.post("/privacy/login", data={"token": token})
    assert signed.status_code == expect, signed.text
    return signed


@contextlib.contextmanager
def signed_in(live: LiveServer, link: str) -> Iterator[httpx.Client]:
    """A browser of its own (its cookies shared with no other client) on the live server,
    signed in to the privacy center for the block: ``link`` is a sign-in link's path,
    opened as a user does (``open_link``), or the token its **Sign in** form posts back."""
    with httpx.Client(base_url=live.url, timeout=120) as browser:
        if link.startswith("/"):
            open_link(browser, link)
        else:
            _press_sign_in(browser, link)
        yield browser


class Lisbon(NamedTuple):
    """What ``lisbon_item`` made: alice's consent and her first extracted item."""

    consent_id: str
    item_id: str


def lisbon_item(client: httpx.Client, app_keys: Apps, uprof: Uprof) -> Lisbon:
    """Alice consents to the planner, which captures "I live in Lisbon" (through
    ``client``, with ``app_keys``); once the server's background pipeline has extracted
    it on the kernel ``uprof``, her consent and first item (the kernel's own read of the
    profile: no door, nothing recorded)."""
    consent_id = grant(client, app_keys.planner)
    captured = client.post(
        "/v1/captures",
        headers=bearer(app_keys.planner),
        json={"subject": "alice", **interaction("I live in Lisbon")},
    )
    assert captured.status_code == 201, captured.text
    assert uprof.wait_until_caught_up(30)
    view = uprof.profile("alice")
    items = [*view.attributes, *view.memories, *view.intents]
    assert items, view
    return Lisbon(consent_id, str(items[0].item_id))


@contextlib.contextmanager
def policy_store_down(backend: Any, uprof: Any) -> Iterator[None]:
    """The deployment's policy store unreadable for the block (its table renamed away, as
    an outage), and readable again after it: its health names the outage inside
    the block and is clean once the table is back."""
    from tests.policies.test_policy_store import _rename_policy_table

    _rename_policy_table(backend, uprof.settings)
    try:
        assert "policy store unreadable" in uprof.policy_health()
        yield
    finally:
        _rename_policy_table(backend, uprof.settings, back=True)
    assert uprof.policy_health() == ""


@contextlib.contextmanager
def table_gone(backend: Backend, uprof: Uprof, table: str) -> Iterator[None]:
    """``table`` of the key store renamed away under the live server for the block (a
    schema that does not match the code: a missing migration, a table dropped by hand),
    on either backend; the database itself answers throughout."""
    gone = f"{table}_gone"
    if backend.kind == "postgres":
        engine = sa.create_engine(backend.url)

        def rename(old: str, new: str) -> None:
            with engine.begin() as conn:
                conn.execute(sa.text(f"ALTER TABLE {old} RENAME TO {new}"))

    else:
        store = uprof.settings.key_path / "keys.sqlite"

        def rename(old: str, new: str) -> None:
            # Through the driver, never open(): FIELD-NOTES 8.1.
            conn = sqlite3.connect(store, timeout=30)
            try:
                conn.execute(f"ALTER TABLE {old} RENAME TO {new}")
                conn.commit()
            finally:
                conn.close()

    rename(table, gone)
    try:
        yield
    finally:
        rename(gone, table)
        if backend.kind == "postgres":
            engine.dispose()
