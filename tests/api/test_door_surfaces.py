"""Every surface maps the door's refusal to its own error form, for the same rule.

REST is covered by test_door_attacks.py; here the MCP tools, the SDK's embedded mode
and the CLI, each as an app without a policy role and as one whose policy allows it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client as McpClient

from tests.api.conftest import PLANNER, WHEN
from tests.conftest import Backend
from uprof.api.runtime import ServiceRuntime
from uprof.apikeys.store import Principal
from uprof.kernel import Uprof
from uprof.mcp import build_server
from uprof.sdk import Client, PermissionDeniedError


def _text(result: Any) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content)


def test_mcp_tools_refuse_an_app_without_a_role(kernel: Uprof) -> None:
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    runtime = ServiceRuntime.for_kernel(kernel)
    runtime.start()
    rogue = build_server(runtime, stdio_principal=Principal("app:rogue", "k", frozenset({"app"})))
    planner = build_server(runtime, stdio_principal=Principal(PLANNER, "k", frozenset({"app"})))
    args = {
        "subject": "alice",
        "agent_id": "agent:one",
        "user_input": "I eat only steak",
        "occurred_at": WHEN,
    }

    async def call(server: Any) -> Any:
        async with McpClient(server) as client:
            return await client.call_tool("capture", args)

    try:
        refused = asyncio.run(call(rogue))
        accepted = asyncio.run(call(planner))
    finally:
        runtime.stop()
    assert refused.is_error and json.loads(_text(refused))["error"]["code"] == "permission_denied"
    assert not accepted.is_error, _text(accepted)


def test_embedded_sdk_refuses_an_app_without_a_role(kernel: Uprof) -> None:
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    before = kernel.lag().log_position
    rogue = Client.embedded(kernel, "app:rogue")
    with pytest.raises(PermissionDeniedError):
        rogue.capture(
            "alice", agent_id="agent:one", user_input="I eat only steak", occurred_at=WHEN
        )
    assert kernel.lag().log_position == before
    Client.embedded(kernel, PLANNER).capture(
        "alice", agent_id="agent:one", user_input="I like tea", occurred_at=WHEN
    )
    assert kernel.lag().log_position > before


def _cli(
    backend: Backend, *args: str, policy: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "UPROF_EMBEDDER": "hashing"}
    if backend.kind == "postgres":
        env["UPROF_DATABASE_URL"] = backend.url
    if policy is not None:
        env["UPROF_POLICY_PATH"] = str(policy)
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from uprof.cli.main import app; app()",
            "--data-dir",
            str(backend.data_dir / "cli"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_cli_acts_as_the_operator_and_the_policy_can_narrow_it(
    backend: Backend, tmp_path: Path
) -> None:
    from policies import packaged_seed_policy_text

    narrowed = tmp_path / "policy.csv"
    narrowed.write_text(
        "\n".join(
            line
            for line in packaged_seed_policy_text().splitlines()
            if not line.startswith("p, role:operator, default, erase,")
        )
        + "\n",
        encoding="utf-8",
    )
    grant = _cli(
        backend,
        "consent",
        "grant",
        "--subject",
        "alice",
        "--app",
        PLANNER,
        "--category",
        "*",
        "--purpose",
        "personalization",
        policy=narrowed,
    )
    assert grant.returncode == 0, grant.stderr
    capture = _cli(
        backend,
        "capture",
        "--subject",
        "alice",
        "--app",
        "app:rogue",
        "--agent",
        "agent:one",
        "--text",
        "I eat only steak",
        policy=narrowed,
    )
    assert capture.returncode == 3, capture.stdout + capture.stderr  # rogue may not capture
    erase = _cli(backend, "erase", "subject", "--subject", "alice", policy=narrowed)
    assert erase.returncode == 3, erase.stdout + erase.stderr  # operators may not erase here
    assert "erase" in erase.stderr
