"""The console's door (0208-sdk-deadline-and-console-door, RM) attacked as a hostile
caller would: a key revoked between pages, a session cookie replayed after sign-out,
another operator's CSRF token, POSTs without one (0212-review-of-0208-to-0210). All held
on main; kept. Each runs on SQLite and PostgreSQL (the ``server`` fixture's stores)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import pytest

from tests.api.conftest import PLANNER, Apps, LiveServer
from tests.web.conftest import csrf_of
from uprof.api import ApiKeyStore
from uprof.web.pages import OPERATOR_COOKIE

GRANT = {"app_id": "app:calendar", "role": "app", "actions": "read", "purpose": "personalization"}


@contextlib.contextmanager
def _signed_in(server: LiveServer, token: str) -> Iterator[tuple[httpx.Client, str]]:
    with httpx.Client(base_url=server.url, timeout=60) as console:
        assert console.post("/console/login", data={"api_key": token}).status_code in (200, 303)
        yield console, csrf_of(console.get("/console/receipts").text)


def _refused(answer: httpx.Response) -> None:
    assert answer.status_code in (303, 401, 403), answer.status_code
    assert "change(s) recorded" not in answer.text
    assert "erased streams" not in answer.text.lower()


def test_held_a_key_revoked_between_pages_opens_no_page_and_changes_nothing(
    server: LiveServer, apps: Apps, keys: ApiKeyStore
) -> None:
    with _signed_in(server, apps.planner_operator) as (console, csrf):
        principal = keys.authenticate(apps.planner_operator)
        assert principal is not None and keys.revoke(principal.key_id)
        _refused(console.get("/console/receipts", follow_redirects=False))
        _refused(console.post("/console/policy/grant", data={"csrf": csrf, **GRANT}))
        _refused(console.post("/console/residue", data={"csrf": csrf, "terms": "Zq7"}))


def test_held_a_session_cookie_replayed_after_sign_out_opens_nothing(
    server: LiveServer, apps: Apps
) -> None:
    with _signed_in(server, apps.planner_operator) as (console, csrf):
        cookie = console.cookies.get(OPERATOR_COOKIE)
        assert cookie
        assert console.post("/console/logout", data={"csrf": csrf}).status_code in (200, 303)
    with httpx.Client(base_url=server.url, timeout=60) as replay:
        replay.cookies.set(OPERATOR_COOKIE, cookie, path="/console")
        _refused(replay.get("/console/receipts", follow_redirects=False))
        _refused(replay.post("/console/residue", data={"csrf": csrf, "terms": "Zq7"}))
        _refused(replay.post("/console/policy/grant", data={"csrf": csrf, **GRANT}))


@pytest.mark.parametrize("token", ["", "not-a-token", "other-operator"])
def test_held_a_console_post_without_its_own_csrf_token_is_refused(
    server: LiveServer, apps: Apps, keys: ApiKeyStore, token: str
) -> None:
    """No token, a made-up one, or a second operator's (their own live session's)."""
    second_token = keys.create(PLANNER, ["app", "operator"]).token
    with (
        _signed_in(server, apps.planner_operator) as (console, _),
        _signed_in(server, second_token) as (_, second_csrf),
    ):
        csrf = second_csrf if token == "other-operator" else token
        for path, form in (
            ("/console/residue", {"terms": "Zq7"}),
            ("/console/policy/grant", GRANT),
        ):
            _refused(console.post(path, data={"csrf": csrf, **form}))
        _refused(console.post("/console/logout", data={"csrf": csrf}))
        assert console.get("/console/receipts").status_code == 200  # still signed in
