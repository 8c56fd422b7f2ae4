"""The held sign-in link of decision 0186, attacked (review of 0186 and 0188), against a
live server on SQLite and PostgreSQL: a sign-in whose browser went away, one that raised
something no handler expects, and a link that expired while a sign-in held it. The
sign-in is stopped at a hook (``first_sign_in_held``), never raced."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import httpx
import pytest

from tests.api.conftest import Apps, LiveServer
from tests.web.conftest import signed_in
from tests.web.test_sign_in_link_held import (
    _alices_link,
    _press,
    _used_entries,
    first_sign_in_held,
)
from uprof.kernel import Uprof
from uprof.web import state
from uprof.web.pages import WebPages
from uprof.web.state import LinkStore


@pytest.fixture
def link_let_go(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Set once a sign-in has let its link go (spent or given back): the test waits for
    the server's thread instead of for time."""
    done = threading.Event()
    for name in ("spend", "give_back"):
        real = getattr(LinkStore, name)

        def let_go(self: LinkStore, *args: Any, _real: Any = real) -> None:
            try:
                _real(self, *args)
            finally:
                done.set()

        monkeypatch.setattr(LinkStore, name, let_go)
    yield done


def _post_and_go_away(url: str, token: str) -> socket.socket:
    """A browser that pressed "Sign in" (the whole request sent) and will close its
    connection before the answer: the socket, still open."""
    host, port = url.removeprefix("http://").split(":")
    body = f"token={token}"
    request = (
        f"POST /privacy/login HTTP/1.1\r\nHost: {host}:{port}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        f"Origin: {url}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
    )
    conn = socket.create_connection((host, int(port)))
    conn.sendall(request.encode())
    return conn


def test_a_sign_in_whose_browser_went_away_lets_its_link_go(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
    link_let_go: threading.Event,
) -> None:
    """Held: the browser closes its connection while the sign-in holds the link. The
    sign-in runs to its end on the server's thread (a disconnect cancels nothing there)
    and lets the link go: it is not held forever, and a later press is answered as the
    finished sign-in left it (its session opened: "Link not valid"), never 409."""
    token, link_id = _alices_link(http, apps, kernel)
    with first_sign_in_held(monkeypatch) as (held, release):
        conn = _post_and_go_away(server.url, token)
        assert held.wait(120), "the sign-in never reached its check"
        conn.close()
        release.set()
        assert link_let_go.wait(120), "the sign-in never let its link go"
    after = _press(server.url, token)
    assert after.status_code == 403 and "Link not valid" in after.text, after.text[-400:]
    assert _used_entries(kernel, link_id) == 1


def test_a_sign_in_that_raises_what_no_handler_expects_gives_its_link_back(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Held: a fault between ``redeem`` and the decision (a ``RuntimeError`` from the
    issuer's check: no outage, no refusal) is a 500, and the ``finally`` gives the link
    back unspent: the next press opens the one session, not 409 for ever."""
    token, link_id = _alices_link(http, apps, kernel)
    real = WebPages.issuer_stands
    raised: list[bool] = []

    def faulty(self: WebPages, request: Any, session: Any) -> bool:
        if not raised:
            raised.append(True)
            raise RuntimeError("a fault no handler expects")
        return real(self, request, session)

    monkeypatch.setattr(WebPages, "issuer_stands", faulty)
    failed = _press(server.url, token)
    assert raised and failed.status_code == 500, failed.text[-400:]
    assert "a fault no handler expects" not in failed.text
    with signed_in(server, token) as browser:
        assert browser.get("/privacy").status_code == 200
    assert _used_entries(kernel, link_id) == 1


def test_a_link_that_expired_while_held_opens_no_session(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The link expires while a sign-in holds it (its checks waited on a slow store);
    meanwhile a second press is told "Link not valid" (an expired held link is dead,
    0186), so the holder must not then open a session with it: the store said the link
    was dead, and a session opened after its expiry outlives the link's promise."""
    token, link_id = _alices_link(http, apps, kernel)
    real_now = state._now
    with (
        ThreadPoolExecutor(max_workers=1) as pool,
        first_sign_in_held(monkeypatch) as (held, release),
    ):
        first = pool.submit(_press, server.url, token)
        assert held.wait(120), "the first sign-in never reached its check"
        later = real_now() + state.LINK_TTL + timedelta(seconds=1)
        monkeypatch.setattr(state, "_now", lambda: later)  # the link's 15 minutes are over
        second = _press(server.url, token)
        release.set()
        answer = first.result(timeout=180)
    assert second.status_code == 403 and "Link not valid" in second.text, second.text[-400:]
    assert answer.status_code == 403 and "Link not valid" in answer.text, (
        answer.status_code,
        answer.text[-400:],
    )
    assert "uprof_privacy" not in answer.cookies
    assert _used_entries(kernel, link_id) == 0
