"""Every MCP tool's refusals name only the arguments that tool takes (0193's Left).

Bug QM: ``profile_slice`` called without a subject was told "name the subject: subject,
session_id or identifier"; the tool takes no ``identifier`` (REST and the SDK do), so an
agent was asked for an argument it cannot send. The check is general: each tool listed
is called with plausible arguments, then with each argument left out or blank, and no
refusal may name, in its fields or its words, an argument of another surface (a name
with an underscore, or ``identifier``) that this tool does not take.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from mcp import Client as McpClient

from tests.api.conftest import PLANNER, planner_mcp_server
from uprof.kernel import Uprof
from uprof.schemas import api as w

PLAUSIBLE: dict[str, Any] = {
    "subject": "alice",
    "agent_id": "agent:one",
    "purpose": "personalization",
    "occurred_at": "2025-01-01T09:00:00+00:00",
    "query": "what to cook",
    "user_input": "I like tea",
}


def _value(name: str, spec: dict[str, Any]) -> Any:
    kinds = {spec.get("type")} | {s.get("type") for s in spec.get("anyOf", ())}
    if "integer" in kinds:
        return 100
    if "boolean" in kinds:
        return False
    return PLAUSIBLE.get(name, "x")


def _other_surfaces_names() -> set[str]:
    """Argument names of every wire body: those a tool may be tempted to ask for."""
    names: set[str] = set()
    for model in vars(w).values():
        if isinstance(model, type) and issubclass(model, w.BaseModel):
            names |= set(model.model_fields)
    return {n for n in names if "_" in n or n == "identifier"}


def _refusals(kernel: Uprof) -> dict[str, list[dict[str, Any]]]:
    async def scenario(server: Any) -> dict[str, list[dict[str, Any]]]:
        async with McpClient(server) as client:
            tools = (await client.list_tools()).tools
            found: dict[str, list[dict[str, Any]]] = {}
            for tool in tools:
                properties: dict[str, Any] = tool.input_schema.get("properties", {})
                base = {
                    n: _value(n, spec)
                    for n, spec in properties.items()
                    if n in tool.input_schema.get("required", ()) or n in PLAUSIBLE
                }
                calls = [base]
                calls += [{k: v for k, v in base.items() if k != n} for n in base]
                calls += [{**base, n: ""} for n, v in base.items() if isinstance(v, str)]
                bodies = found.setdefault(tool.name, [])
                for arguments in calls:
                    result = await client.call_tool(tool.name, arguments)
                    if result.is_error:
                        text = " ".join(getattr(b, "text", "") for b in result.content)
                        bodies.append({"arguments": sorted(properties), **json.loads(text)})
            return found

    with planner_mcp_server(kernel) as server:
        return asyncio.run(scenario(server))


def test_qm_every_tool_refusal_names_only_its_own_arguments(kernel: Uprof) -> None:
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    foreign = _other_surfaces_names()
    refusals = _refusals(kernel)
    assert set(refusals) >= {"profile_slice", "capture", "forget"}, refusals
    assert all(refusals.values()), refusals  # each tool was refused at least once
    for tool, bodies in refusals.items():
        for body in bodies:
            own = set(body["arguments"])
            error = body["error"]
            assert {f["field"].split(".")[0] for f in error["fields"]} <= own, (tool, error)
            words = set(re.findall(r"[a-z_]+", f"{error['message']} {error['hint']}"))
            assert not (words & foreign) - own, (tool, error)
