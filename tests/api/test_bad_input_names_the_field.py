"""A 422 names the offending field in ``error.fields`` (docs/api.md, "Errors"), also when
the check that refuses the value runs past the request models, in the facade or the kernel.

Found in a hostile-caller review (2026-12-05): each request below was refused with a 422
whose message named the field but whose ``error.fields`` was empty, on the code before the
fix, so a client reading ``fields`` (the SDK's ``InvalidRequestError.fields``, a form
highlighting the field) could not tell what to fix.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from mcp import Client as McpClient

from tests.api.conftest import PLANNER, Apps, bearer, grant, interaction
from uprof.api.runtime import ServiceRuntime
from uprof.apikeys.store import Principal
from uprof.kernel import Uprof
from uprof.mcp import build_server

SLICE = {"subject": "alice", "query": "q", "budget_tokens": 100, "purpose": "personalization"}


def _fields(response: httpx.Response) -> list[str]:
    assert response.status_code == 422, response.text
    return [f["field"] for f in response.json()["error"]["fields"]]


def test_each_refused_value_is_named_in_fields(http: httpx.Client, apps: Apps) -> None:
    grant(http, apps.planner)
    key = bearer(apps.planner)
    cases: list[tuple[str, dict[str, str], dict[str, Any], str]] = [
        ("/v1/slices", {}, {**SLICE, "agent_id": "app:calendar/agent:one"}, "agent_id"),
        ("/v1/slices", {}, {**SLICE, "agent_id": "a" * 128}, "agent_id"),
        (
            "/v1/captures",
            {},
            {"subject": "alice", **interaction("hi", agent="app:calendar/agent:one")},
            "agent_id",
        ),
        (
            "/v1/consents",
            {},
            {"subject": "alice", "categories": ["diet"], "purposes": ["personalization"]},
            "collected_by",
        ),
        (
            "/v1/consents",
            {},
            {
                "subject": "alice",
                "categories": ["diet"],
                "purposes": ["personalization"],
                "collected_by": "consent-ui:1",
                "expires_at": "2001-01-01T00:00:00Z",
            },
            "expires_at",
        ),
    ]
    for path, headers, body, field in cases:
        response = http.post(path, headers={**key, **headers}, json=body)
        assert _fields(response) == [field], (path, body)
    # A header the HTTP client sends as latin-1 bytes: not visible ASCII.
    keyed = http.post(
        "/v1/captures",
        headers={**key, "Idempotency-Key": "clé".encode("latin-1")},  # type: ignore[dict-item]
        json={"subject": "alice", **interaction("hi")},
    )
    assert _fields(keyed) == ["Idempotency-Key"]


def test_mcp_forget_names_a_bad_subject(kernel: Uprof) -> None:
    """``forget`` without ``erase`` reads the consents in force from the subject's stream,
    past any request model: an over-long, blank or NUL-carrying subject was
    ``invalid_input`` with no field (or, with NUL, looked up as a name), where REST and
    ``forget`` with ``erase`` answer ``invalid_request`` naming ``subject``."""
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    runtime = ServiceRuntime.for_kernel(kernel)
    server = build_server(runtime, stdio_principal=Principal(PLANNER, "k", frozenset({"app"})))

    async def calls() -> list[Any]:
        async with McpClient(server) as client:
            return [
                await client.call_tool("forget", {"subject": subject})
                for subject in ("x" * 300, "   ", "ali\x00ce")
            ]

    runtime.start()
    try:
        results = asyncio.run(calls())
    finally:
        runtime.stop()
    for result in results:
        assert result.is_error
        text = " ".join(getattr(block, "text", "") for block in result.content)
        assert [f["field"] for f in json.loads(text)["error"]["fields"]] == ["subject"], text
    assert all(c.withdrawn_at is None for c in kernel.profile("alice").consents)
