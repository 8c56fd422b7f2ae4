"""The console's sign-in opens a session only for a key that still stands once the
sign-in is on the log (SQLite and PostgreSQL, a live server, the key revoked by
``uprof apps revoke`` in a process of its own).

``POST /console/login`` authenticates the key, counts it against its allowance, records
``console.signed_in`` (the audit log's write: its lock, another writer's turn) and then
creates the session. 0211-console-and-center-finish left it (Left): a key revoked after
it authenticated and before the session existed got a session cookie, 303 to the
console (bug TV). Each page asks the key again, so that session opened nothing; the
sign-in now asks too, once the entry is written and before the session is created, and
a revoked key gets no session at all.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.conftest import PLANNER, LiveServer, revoke_with_the_cli
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.settings import Settings
from uprof.web.pages import OPERATOR_COOKIE


def _while_the_sign_in_is_recorded(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch, what: Any
) -> list[bool]:
    """Run ``what`` once, when the sign-in's ``console.signed_in`` entry goes to the audit
    log (where the sign-in waits for the log's write lock), before the log takes it."""
    real = kernel.audit_log.append_many
    ran: list[bool] = []

    def append_many(entries: Any, **options: Any) -> Any:
        entries = list(entries)
        if not ran and any(e.get("action") == "console.signed_in" for e in entries):
            what()
            ran.append(True)
        return real(entries, **options)

    monkeypatch.setattr(kernel.audit_log, "append_many", append_many)
    return ran


def _signed_in_entries(kernel: Uprof, key_id: str) -> int:
    kernel.reads.drain()
    return sum(
        1
        for e in kernel.audit_log.entries()
        if e.entry["action"] == "console.signed_in" and e.entry.get("api_key_id") == key_id
    )


def test_a_key_revoked_while_its_sign_in_was_recorded_gets_no_session(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug TV: the key authenticates; while the sign-in is recorded another process
    revokes it. Asked again before the session is created: 403, no session cookie, and
    the console opens nothing with what the browser holds."""
    issued = keys.create(PLANNER, ["app", "operator"])
    ran = _while_the_sign_in_is_recorded(
        kernel, monkeypatch, lambda: revoke_with_the_cli(settings, issued.info.key_id)
    )
    with httpx.Client(base_url=server.url, timeout=60) as console:
        signed = console.post(
            "/console/login", data={"api_key": issued.token}, follow_redirects=False
        )
        assert ran == [True]
        assert signed.status_code == 403, (signed.status_code, signed.text[-300:])
        assert "Your API key is no longer valid" in signed.text
        assert OPERATOR_COOKIE not in signed.cookies
        opened = console.get("/console", follow_redirects=False)
    assert opened.status_code == 303, opened.status_code
    assert opened.headers["location"] == "/console/login"


def test_held_a_sign_in_whose_key_stands_opens_its_session(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guard of TV's test: the same wait, another key of the same app revoked by
    another process meanwhile: the signing key stands, so its session opens (one
    ``console.signed_in`` entry) and shows the console."""
    issued = keys.create(PLANNER, ["app", "operator"])
    sibling = keys.create(PLANNER, ["app", "operator"])
    ran = _while_the_sign_in_is_recorded(
        kernel, monkeypatch, lambda: revoke_with_the_cli(settings, sibling.info.key_id)
    )
    with httpx.Client(base_url=server.url, timeout=60) as console:
        signed = console.post(
            "/console/login", data={"api_key": issued.token}, follow_redirects=False
        )
        assert ran == [True]
        assert signed.status_code == 303, signed.text[-300:]
        assert OPERATOR_COOKIE in signed.cookies
        opened = console.get("/console", follow_redirects=False)
    assert opened.status_code == 200, opened.status_code
    assert _signed_in_entries(kernel, issued.info.key_id) == 1
