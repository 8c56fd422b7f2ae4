"""The audit trail tells the truth about a console sign-in refused at the write (SQLite
and PostgreSQL, a live server, the key revoked by ``uprof apps revoke`` in a process of
its own while the sign-in's entry waits for the log's turn).

0218-key-rechecked-at-the-write (bug TV) made ``POST /console/login`` ask the key again
once its ``console.signed_in`` entry was written and refuse the session when it had been
revoked meanwhile; the entry stayed (its Left): an exported trail said a session was
given that never was (bug UQ). The key is now asked under the log's write lock, where the
entry takes its place: a key revoked before that gets ``console.sign_in_refused``
(``reason_code`` key-revoked) and no ``console.signed_in``; a revocation after it is on
the log after it (``apikey.revoked`` waits for the same lock).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import PLANNER, LiveServer, revoke_with_the_cli
from tests.web.test_console_sign_in_key_at_the_write import _while_the_sign_in_is_recorded
from uprof.api import ApiKeyStore
from uprof.facade import Facade
from uprof.kernel import Uprof
from uprof.settings import Settings
from uprof.web.pages import OPERATOR_COOKIE


def _exported_entries(kernel: Uprof, tmp_path: Path) -> list[dict[str, Any]]:
    """The app's trail as a compliance reader exports it (``export_audit``, JSONL), in
    log order: the entries only."""
    from domain.principal import Principal

    kernel.reads.drain()
    dest = tmp_path / "trail.jsonl"
    reader = Facade(kernel, Principal.local_operator(kernel.subjects.tenant))
    reader.export_audit(dest, fmt="jsonl", app_id=PLANNER)
    lines = [json.loads(line) for line in dest.read_text("utf-8").splitlines()]
    return [line["entry"] for line in lines if line.get("kind") == "entry"]


def _of_key(entries: list[dict[str, Any]], key_id: str) -> list[tuple[str, str | None]]:
    return [
        (e["action"], e.get("reason_code"))
        for e in entries
        if e.get("api_key_id") == key_id
        and e["action"] in {"console.signed_in", "console.sign_in_refused", "apikey.revoked"}
    ]


def test_uq_a_sign_in_refused_at_the_write_leaves_no_signed_in_entry(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Bug UQ: the key is revoked by another process while its sign-in waits to be
    written. No session (TV's 403), and the exported trail says so: the revocation, then
    the refused sign-in; no ``console.signed_in`` of that key anywhere."""
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
    assert OPERATOR_COOKIE not in signed.cookies
    trail = _of_key(_exported_entries(kernel, tmp_path), issued.info.key_id)
    assert trail == [
        ("apikey.revoked", None),
        ("console.sign_in_refused", "key-revoked"),
    ], trail


def test_held_a_sign_in_whose_key_stands_is_on_the_trail_once_before_its_revocation(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    tmp_path: Path,
) -> None:
    """The guard: a key that stands signs in (303, a session), its one
    ``console.signed_in`` on the trail; revoked afterwards by another process, the
    revocation follows it and the session opens nothing more."""
    issued = keys.create(PLANNER, ["app", "operator"])
    with httpx.Client(base_url=server.url, timeout=60) as console:
        signed = console.post(
            "/console/login", data={"api_key": issued.token}, follow_redirects=False
        )
        assert signed.status_code == 303, signed.text[-300:]
        assert console.get("/console", follow_redirects=False).status_code == 200
        revoke_with_the_cli(settings, issued.info.key_id)
        after = console.get("/console", follow_redirects=False)
    assert after.status_code == 403, after.status_code
    trail = _of_key(_exported_entries(kernel, tmp_path), issued.info.key_id)
    assert trail == [("console.signed_in", None), ("apikey.revoked", None)], trail
