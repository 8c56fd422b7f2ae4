"""A console audit export being streamed ends when the session's API key is revoked.

The REST export authenticates its key again every ``STREAM_RECHECK_RECORDS`` records
(decision 0064); the compliance console's export, the same trail behind a session signed
in with an operator key, checked the key only when the download began and then sent
every record after the key was revoked (found 2026-12-05). It now checks the session's
key at the same interval.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from tests.api.conftest import PLANNER, LiveServer
from uprof.api import ApiKeyStore
from uprof.facade import AuditStream, Facade
from uprof.kernel import Uprof

RECHECK = 5
ENTRIES = 60


def test_a_key_revoked_mid_export_cuts_the_console_stream(
    server: LiveServer, kernel: Uprof, keys: ApiKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("uprof.api.deps.STREAM_RECHECK_RECORDS", RECHECK)
    kernel.audit.record_many([("test.filler", {"counts": {"n": i}}) for i in range(ENTRIES)])
    issued = keys.create(PLANNER, ["app", "operator"])
    exporting = Facade.stream_audit

    def revoked_while_streaming(self: Facade, **kwargs: Any) -> AuditStream:
        stream = exporting(self, **kwargs)

        def records() -> Iterator[str]:
            for sent, record in enumerate(stream.records):
                if sent == 2:
                    keys.revoke(issued.info.key_id)  # `uprof apps revoke`, meanwhile
                yield record

        return replace(stream, records=records())

    monkeypatch.setattr(Facade, "stream_audit", revoked_while_streaming)
    with httpx.Client(base_url=server.url, timeout=30) as console:
        signed_in = console.post("/console/login", data={"api_key": issued.token})
        assert signed_in.status_code in (200, 303), signed_in.text
        received: list[str] = []
        with (
            pytest.raises(httpx.HTTPError),
            console.stream("GET", "/console/audit/export") as response,
        ):
            assert response.status_code == 200
            received.extend(response.iter_lines())
        assert len(received) <= RECHECK + 1  # not the ~60 records of the whole trail
        # And the session is gone with its key.
        assert console.get("/console").status_code == 403


def test_a_live_key_downloads_the_whole_console_export(
    server: LiveServer, kernel: Uprof, keys: ApiKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("uprof.api.deps.STREAM_RECHECK_RECORDS", RECHECK)
    kernel.audit.record_many([("test.filler", {"counts": {"n": i}}) for i in range(ENTRIES)])
    issued = keys.create(PLANNER, ["app", "operator"])
    with httpx.Client(base_url=server.url, timeout=30) as console:
        console.post("/console/login", data={"api_key": issued.token})
        response = console.get("/console/audit/export")
        assert response.status_code == 200
        assert sum(1 for line in response.text.splitlines() if '"kind":"entry"' in line) >= ENTRIES
