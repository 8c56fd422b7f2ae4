"""The console's door asks the session's key again after a long action (bug RM).

The console's pages ask whether the operator's key is live when a page opens
(``need_operator``); a residue scan reads every file and table (minutes at scale,
0187), and its report went to a browser whose key was revoked during the scan
(0205-hostile-callers-round-9, Left). The door now carries the key's liveness as its
credential check, asked again where the facade decides a long action again.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.conftest import Apps, LiveServer
from tests.web.conftest import csrf_of
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof


def _revoked_during_the_scan(
    kernel: Uprof, keys: ApiKeyStore, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Revoke the key ``token`` while ``kernel``'s next residue scans run, once each has
    read everything."""
    principal = keys.authenticate(token)
    assert principal is not None
    scan = kernel.residue_scan

    def revoked_during_the_scan(terms: Any) -> Any:
        report = scan(terms)
        assert keys.revoke(principal.key_id)
        return report

    monkeypatch.setattr(kernel, "residue_scan", revoked_during_the_scan)


def test_a_residue_report_is_not_shown_once_the_key_was_revoked_during_the_scan(
    server: LiveServer,
    apps: Apps,
    kernel: Uprof,
    keys: ApiKeyStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scan's report (where the terms were found, the erased streams) is not shown to
    a session whose key was revoked while it ran: refused, and the session is over."""
    with httpx.Client(base_url=server.url, timeout=60) as console:
        assert console.post("/console/login", data={"api_key": apps.planner_operator})
        csrf = csrf_of(console.get("/console/receipts").text)
        _revoked_during_the_scan(kernel, keys, apps.planner_operator, monkeypatch)
        scanned = console.post("/console/residue", data={"csrf": csrf, "terms": "Zq7"})
        assert scanned.status_code in (401, 403), scanned.status_code
        assert "erased streams" not in scanned.text.lower()
        assert "Zq7" not in scanned.text
        after = console.get("/console/receipts", follow_redirects=False)
        assert after.status_code in (303, 401, 403), after.status_code
