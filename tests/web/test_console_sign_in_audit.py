"""A compliance-console sign-in is on the audit log, as the key's other uses are.

Signing in to the console with an operator API key opens a session that reads and exports
the whole audit trail; until 2026-12-05 the sign-in left no entry, so the log did not show
which key opened a console session, or that a key without the operator role tried to.
Both are recorded now (``console.signed_in``, ``console.sign_in_refused``: the app and the
key's public id, never the key), before the session exists. An unknown key is not recorded:
it names no one, and anybody could fill the log with them.
"""

from __future__ import annotations

import httpx

from tests.api.conftest import PLANNER, LiveServer
from tests.web.conftest import csrf_of
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof


def test_console_sign_ins_are_audited_without_the_key(
    server: LiveServer, kernel: Uprof, keys: ApiKeyStore
) -> None:
    operator = keys.create(PLANNER, ["app", "operator"])
    app_only = keys.create(PLANNER)
    with httpx.Client(base_url=server.url, timeout=30) as console:
        assert console.post("/console/login", data={"api_key": "upk_nope"}).status_code == 401
        assert console.post("/console/login", data={"api_key": app_only.token}).status_code == 403
        signed_in = console.post("/console/login", data={"api_key": operator.token})
        assert signed_in.status_code == 303, signed_in.text

    entries = [(e.entry, e.entry_json) for e in kernel.audit_log.entries()]
    signs = [e for e, _ in entries if e["action"].startswith("console.sign")]

    assert [(e["action"], e["api_key_id"]) for e in signs] == [
        ("console.sign_in_refused", app_only.info.key_id),
        ("console.signed_in", operator.info.key_id),
    ]
    assert {e["app_id"] for e in signs} == {PLANNER}
    for issued in (operator, app_only):
        secret = issued.token.split("_", 2)[2]
        assert not any(secret in text for _, text in entries)


def test_a_console_sign_out_is_audited_once_without_the_key(
    server: LiveServer, kernel: Uprof, keys: ApiKeyStore
) -> None:
    """Until 2026-12-05 a sign-out left no entry: the log showed when a console session
    began and not when its holder ended it. ``console.signed_out`` names the session's
    app and key id (never the key, the cookie or the session id), once per session: a
    second sign-out with the same cookie, or one with no session, names no one."""
    operator = keys.create(PLANNER, ["app", "operator"])
    with httpx.Client(base_url=server.url, timeout=30) as console:
        assert console.post("/console/login", data={"api_key": operator.token}).status_code == 303
        cookie = dict(console.cookies)
        csrf = csrf_of(console.get("/console").text)
        signed_out = console.post("/console/logout", data={"csrf": csrf}, follow_redirects=False)
        assert signed_out.status_code == 303, signed_out.text
        assert console.get("/console", follow_redirects=False).status_code == 303
    with httpx.Client(base_url=server.url, timeout=30, cookies=cookie) as copy:
        again = copy.post("/console/logout", data={"csrf": csrf}, follow_redirects=False)
        assert again.status_code == 303
    with httpx.Client(base_url=server.url, timeout=30) as nobody:
        assert nobody.post("/console/logout", follow_redirects=False).status_code == 303

    entries = [(e.entry, e.entry_json) for e in kernel.audit_log.entries()]
    signs = [e for e, _ in entries if e["action"].startswith("console.sign")]

    assert [(e["action"], e["app_id"], e["api_key_id"]) for e in signs] == [
        ("console.signed_in", PLANNER, operator.info.key_id),
        ("console.signed_out", PLANNER, operator.info.key_id),
    ]
    secret = operator.token.split("_", 2)[2]
    assert not any(secret in text for _, text in entries)
    assert not any(value in text for value in cookie.values() for _, text in entries)
