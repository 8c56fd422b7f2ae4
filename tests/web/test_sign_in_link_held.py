"""A privacy link while one sign-in holds it, and the audit trail of a sign-in an outage
stopped (review of 0181 and 0182), on SQLite and PostgreSQL against a live server. The
sign-in that holds the link is stopped at a controllable point (``first_sign_in_held``),
not raced: each test failed on main before its fix."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.api.conftest import Apps, LiveServer, grant
from tests.conftest import Backend
from tests.web.conftest import link_token, policy_store_down, privacy_link, signed_in
from uprof.kernel import Uprof
from uprof.web.pages import WebPages


def _press(url: str, token: str, client: httpx.Client | None = None) -> httpx.Response:
    """A browser pressing "Sign in" with ``token`` (a fresh one unless ``client``)."""
    if client is not None:
        return client.post("/privacy/login", data={"token": token})
    with httpx.Client(base_url=url, timeout=120) as browser:
        return browser.post("/privacy/login", data={"token": token})


@contextlib.contextmanager
def first_sign_in_held(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[threading.Event, threading.Event]]:
    """The next sign-in stops just after it redeemed its link (at its first check, the
    subject's incarnation) until the block sets ``release``; it sets ``held`` once
    there. Every later check passes straight through. Yields ``(held, release)``."""
    real = WebPages.same_incarnation
    held, release = threading.Event(), threading.Event()
    first = threading.Lock()

    def stopped(self: WebPages, request: Any, subject: str, incarnation: str) -> bool:
        if first.acquire(blocking=False):
            held.set()
            assert release.wait(120), "the test never let the held sign-in go on"
        return real(self, request, subject, incarnation)

    monkeypatch.setattr(WebPages, "same_incarnation", stopped)
    try:
        yield held, release
    finally:
        release.set()


def _entries(kernel: Uprof, action: str) -> list[dict[str, Any]]:
    return [e.entry for e in kernel.audit_log.entries() if e.entry["action"] == action]


def _last_link_id(kernel: Uprof) -> str:
    return str(_entries(kernel, "privacy_link.issued")[-1]["link_id"])


def _used_entries(kernel: Uprof, link_id: str) -> int:
    return sum(1 for e in _entries(kernel, "privacy_link.used") if e.get("link_id") == link_id)


def _alices_link(http: httpx.Client, apps: Apps, kernel: Uprof) -> tuple[str, str]:
    """Alice consents, and an operator is handed a link to her privacy center: the token
    its page posts back, and the link's id."""
    grant(http, apps.planner)
    token = link_token(http, privacy_link(http, apps.planner_operator, "alice"))
    return token, _last_link_id(kernel)


def _spent_by_one_session(server: LiveServer, kernel: Uprof, token: str, link_id: str) -> None:
    """The link opened one session, recorded once, and is spent: "Link not valid"."""
    spent = _press(server.url, token)
    assert spent.status_code == 403 and "Link not valid" in spent.text
    assert _used_entries(kernel, link_id) == 1


def _held_while_pressed(
    server: LiveServer, token: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[httpx.Response, httpx.Response]:
    """The first browser's press holds the link (redeemed, not decided) while a second
    browser presses with the same link; then the first goes on. Returns (first's answer,
    second's answer)."""
    # The hold is let go (its block's end) before the pool waits for the first press.
    with (
        ThreadPoolExecutor(max_workers=1) as pool,
        first_sign_in_held(monkeypatch) as (held, release),
    ):
        first = pool.submit(_press, server.url, token)
        assert held.wait(120), "the first sign-in never reached its check"
        second = _press(server.url, token)
        release.set()
        return first.result(timeout=180), second


def _in_use(answer: httpx.Response) -> None:
    """``answer`` is "this link is in use, retry" (409 ``request_in_progress``, as a keyed
    request whose first still runs, with ``Retry-After``): no session, and not "Link not
    valid"."""
    shown = (answer.status_code, answer.headers.get("Retry-After"))
    assert answer.status_code == 409 and int(shown[1] or 0) > 0, (shown, answer.text[-600:])
    assert "Sign-in in progress" in answer.text and "not used up" in answer.text
    assert "Link not valid" not in answer.text
    assert "uprof_privacy" not in answer.cookies


def test_nw_a_press_while_another_sign_in_holds_the_link_is_told_to_retry(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug NW: a press arriving while another browser's press held the link (redeemed,
    not decided yet) was answered 403 "Link not valid" although the link was not spent
    and the other press might still give it back. Now 409 with ``Retry-After``, "in use";
    the holder decides: here it opens the one session, and only then is the link
    spent ("Link not valid")."""
    token, link_id = _alices_link(http, apps, kernel)
    first, second = _held_while_pressed(server, token, monkeypatch)
    _in_use(second)
    assert first.status_code == 303, first.text[-600:]
    _spent_by_one_session(server, kernel, token, link_id)


def test_nw_a_press_while_an_outage_stops_the_holder_is_told_to_retry_and_the_link_stays(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug NW during an outage (the raced test in test_review_0174_0177.py, made
    deterministic): the holder is stopped by the policy store not answering (503, the
    link given back), the press beside it was told "Link not valid" (403) though the
    link was never spent. Now "in use, retry" (409); nothing is spent during the outage
    and the link opens exactly one session after it."""
    token, link_id = _alices_link(http, apps, kernel)
    with policy_store_down(backend, kernel):
        first, second = _held_while_pressed(server, token, monkeypatch)
        again = _press(server.url, token)  # the holder gave it back: the outage's answer
    _in_use(second)
    for refused in (first, again):
        shown = (refused.status_code, refused.headers.get("Retry-After"))
        assert refused.status_code == 503 and int(shown[1] or 0) > 0, (shown, refused.text[-600:])
        assert "uprof_privacy" not in refused.cookies
    assert _used_entries(kernel, link_id) == 0
    with signed_in(server, token) as browser:
        assert browser.get("/privacy").status_code == 200
    _spent_by_one_session(server, kernel, token, link_id)


def test_nx_a_sign_in_an_outage_stopped_after_its_checks_leaves_no_used_entry(
    server: LiveServer,
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug NX (0182's Left): a sign-in wrote ``privacy_link.used`` and then signed the
    browser's earlier session out; the database failing that sign-out (503, the link
    given back) left an entry saying the link was used by a sign-in that opened nothing,
    and the retry wrote a second entry for the one session. Now the entry is the last
    step that can fail: none for the stopped sign-in, exactly one for the session."""
    token, link_id = _alices_link(http, apps, kernel)
    assert kernel.web_sign_outs is not None
    # An earlier session of this browser.
    with signed_in(server, privacy_link(http, apps.planner_operator, "alice")) as browser:
        real = kernel.web_sign_outs.sign_out
        calls: list[str] = []

        def database_gone(session_id: str, **kwargs: Any) -> None:
            calls.append(session_id)
            raise sa.exc.OperationalError(
                "DELETE FROM signed_out_sessions", {}, ConnectionError("connection refused")
            )

        monkeypatch.setattr(kernel.web_sign_outs, "sign_out", database_gone)
        refused = _press(server.url, token, browser)
        monkeypatch.setattr(kernel.web_sign_outs, "sign_out", real)
        assert calls, "the sign-in never signed the earlier session out"
        assert refused.status_code == 503, (refused.status_code, refused.text[-600:])
        assert int(refused.headers["Retry-After"]) > 0
        assert _used_entries(kernel, link_id) == 0
        assert _press(server.url, token, browser).status_code == 303
        assert browser.get("/privacy").status_code == 200
    assert _used_entries(kernel, link_id) == 1
