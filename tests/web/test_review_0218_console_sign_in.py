"""Review of 0218-key-rechecked-at-the-write, the console's sign-in (TV) against an outage
(SQLite and PostgreSQL, a live server): the key asked again before the session is made
(``operator_key_stands``, the key store read now) and the key store not answering."""

from __future__ import annotations

import httpx
import pytest
import sqlalchemy as sa

from tests.api.conftest import PLANNER, LiveServer
from tests.web.test_console_sign_in_key_at_the_write import (
    _signed_in_entries,
    _while_the_sign_in_is_recorded,
)
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.web.pages import OPERATOR_COOKIE


def test_held_the_key_store_down_when_the_sign_in_asks_again_gives_no_session(
    server: LiveServer, kernel: Uprof, keys: ApiKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held: the key authenticates; while its sign-in is recorded the key store stops
    answering; asked again where its entry is written: 503 (an outage page), no session
    cookie, no `console.signed_in` entry, and the console opens nothing."""
    issued = keys.create(PLANNER, ["app", "operator"])
    listed: list[str] = []

    def down(app_id: str) -> object:
        listed.append(app_id)
        raise sa.exc.OperationalError(
            "SELECT api_keys", {}, ConnectionError("server closed the connection")
        )

    ran = _while_the_sign_in_is_recorded(
        kernel, monkeypatch, lambda: monkeypatch.setattr(keys, "list", down)
    )
    with httpx.Client(base_url=server.url, timeout=60) as console:
        signed = console.post(
            "/console/login", data={"api_key": issued.token}, follow_redirects=False
        )
        assert ran == [True] and listed, "the sign-in never asked the key store again"
        assert signed.status_code == 503, (signed.status_code, signed.text[-300:])
        assert OPERATOR_COOKIE not in signed.cookies
        monkeypatch.undo()
        opened = console.get("/console", follow_redirects=False)
    assert opened.status_code == 303, opened.status_code
    assert opened.headers["location"] == "/console/login"
    # No session was given, and the log does not say one was (bug UQ, decision
    # 0227-leftovers-of-0218-to-0223): the check that failed runs under the log's lock.
    assert _signed_in_entries(kernel, issued.info.key_id) == 0
