"""The MCP ``forget`` tool asked again after its erasure answered ``erasure_incomplete``
(both backends): the agent's only way to finish it is to call the tool again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from mcp import Client

from audit.receipts import verify_receipt
from tests.api.conftest import PLANNER
from tests.api.test_mcp import error_code, text_of
from tests.kernel.conftest import say
from tests.kernel.test_erasure_resume_scopes import projections_stall_after_first_wait
from uprof.api.runtime import ServiceRuntime
from uprof.apikeys.store import Principal
from uprof.kernel import Uprof
from uprof.mcp import build_server


@pytest.mark.parametrize("named", [True, False], ids=["consent-id", "all-consents"])
def test_forget_with_erase_asked_again_finishes_the_incomplete_erasure(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch, named: bool
) -> None:
    consent_id = kernel.grant_consent(
        "alice", app_id=PLANNER, categories=["*"], purposes=["personalization"]
    )
    runtime = ServiceRuntime.for_kernel(kernel)
    runtime.start()
    kernel.capture("alice", say("I want to learn to sail", app=PLANNER))
    runtime.wake()
    assert kernel.wait_until_caught_up(30)
    server = build_server(runtime, stdio_principal=Principal(PLANNER, "k", frozenset({"app"})))
    args: dict[str, Any] = {"subject": "alice", "erase": True}
    if named:
        args["consent_id"] = consent_id

    async def forget() -> Any:
        async with Client(server) as client:
            return await client.call_tool("forget", args)

    try:
        with monkeypatch.context() as behind:
            projections_stall_after_first_wait(kernel, behind)
            first = asyncio.run(forget())
        assert error_code(first) == "erasure_incomplete", text_of(first)
        ledger = kernel.keystore.ledger
        assert ledger is not None
        record = ledger.unfinished(
            kernel.subjects.tenant, "alice", scope="consent-withdrawal", target=[consent_id]
        )
        assert record is not None

        again = asyncio.run(forget())
    finally:
        runtime.stop()

    assert not again.is_error, text_of(again)
    erasures = again.structured_content["erasures"]
    assert [e["receipt"]["body"]["request"]["request_id"] for e in erasures] == [record.request_id]
    verify_receipt(
        erasures[0]["receipt"], kernel.audit_log.public_key, origin=kernel.audit_log.origin
    )
    assert kernel.profile("alice").memories == ()
