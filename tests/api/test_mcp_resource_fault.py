"""A fault under the MCP profile resource (0193's Left, beside QN).

Bug QP: a fault (not a refusal, not an outage) under ``uprof://profile/{subject}`` reached
the MCP SDK as an unexpected resource error, which the SDK logs at ERROR with the
resource's URI, the subject reference in it (I9: no subject reference in a log; the
resource's refusals were kept out of the log for that reason), and answers with a
generic text. Now the fault is logged without the URI, and the caller gets a protocol
error whose message is REST's 500 body, ``internal``, as the tools' (QN).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from mcp import Client as McpClient

from tests.api.conftest import PLANNER, planner_mcp_server
from uprof.api.scoped import AppScope
from uprof.kernel import Uprof

SUBJECT = "zoe-7Hq2@example.com"


def test_qp_a_fault_under_the_profile_resource_logs_no_subject_and_answers_internal(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    kernel.grant_consent(SUBJECT, app_id=PLANNER, categories=["*"], purposes=["personalization"])

    def broken(self: AppScope, body: Any) -> Any:
        raise RuntimeError("cannot read /srv/uprof/data.keys/master.key")

    monkeypatch.setattr(AppScope, "slice", broken)

    async def scenario(server: Any) -> str:
        async with McpClient(server) as client:
            try:
                await client.read_resource(f"uprof://profile/{SUBJECT}")
            except Exception as refused:  # the SDK's protocol error
                return str(refused)
            raise AssertionError("the resource was served")

    caplog.set_level(logging.DEBUG)
    with planner_mcp_server(kernel) as server:
        text = asyncio.run(scenario(server))
    logged = "\n".join(f"{r.getMessage()} {r.exc_text or ''} {r.args!r}" for r in caplog.records)
    assert "RuntimeError" in logged  # the fault is on the server's log
    assert "zoe-7Hq2" not in logged, logged[:2000]
    assert "master.key" not in text
    assert json.loads(text)["error"]["code"] == "internal", text
