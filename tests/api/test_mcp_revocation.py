"""A running MCP stdio server stops acting for its key once the key is revoked.

Over stdio the key comes once, in ``UPROF_API_KEY``, when the client spawns the server.
The server used to check it only at start and then act as its app for as long as it
ran: ``uprof apps revoke`` (another process) did not stop a stdio session, while the
same key over REST or MCP-over-HTTP was refused within ``KEY_CACHE_TTL_S``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

from mcp import Client, StdioServerParameters

from tests.api.conftest import PLANNER
from tests.api.test_mcp import error_code, text_of
from tests.conftest import Backend
from uprof.api import ApiKeyStore
from uprof.apikeys.store import KEY_CACHE_TTL_S
from uprof.kernel import Uprof

SLICE = {
    "subject": "alice",
    "query": "what instrument?",
    "agent_id": "agent:one",
    "purpose": "personalization",
    "budget_tokens": 200,
}


def stdio_params(kernel: Uprof, backend: Backend, key: str) -> StdioServerParameters:
    args = ["-m", "uprof.mcp", "--data-dir", str(kernel.settings.data_dir)]
    if backend.kind == "postgres":
        args += ["--database-url", backend.url]
    args += ["--embedder", "hashing", "mcp", "--transport", "stdio"]
    env = {**os.environ, "UPROF_API_KEY": key, "HF_HUB_OFFLINE": "1"}
    return StdioServerParameters(command=sys.executable, args=args, env=env)


def test_a_stdio_session_is_refused_once_its_key_is_revoked_elsewhere(
    backend: Backend, kernel: Uprof, keys: ApiKeyStore
) -> None:
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    issued = keys.create(PLANNER)

    async def scenario() -> Any:
        params = stdio_params(kernel, backend, issued.token)
        async with Client(params, read_timeout_seconds=120) as client:
            before = await client.call_tool("profile_slice", SLICE)
            assert not before.is_error, text_of(before)
            keys.revoke(issued.info.key_id)  # `uprof apps revoke`, another process
            await asyncio.sleep(KEY_CACHE_TTL_S + 0.5)
            return await client.call_tool("profile_slice", SLICE)

    began = time.monotonic()
    after = asyncio.run(scenario())
    assert error_code(after) == "unauthenticated", (text_of(after), time.monotonic() - began)
