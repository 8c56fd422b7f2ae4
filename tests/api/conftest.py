"""Fixtures for the service surfaces: a kernel on each backend, API keys, a live server.

The live server is real uvicorn on a loopback socket in a thread, serving
``create_server`` over a kernel built like ``uprof serve`` builds it (background
workers on), with fakes for the clock-independent parts (hashing embedder, the
deterministic extractor), so tests exercise HTTP, auth and the worker for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from tests.children import run_python
from tests.conftest import OTHER_TENANT, Backend, seed_policy_for
from tests.fakes.ports import FakeExtractor
from uprof.adapters.embeddings import HashingEmbedder
from uprof.api import ApiKeyStore
from uprof.api.logconfig import server_log_config
from uprof.bootstrap import bootstrap
from uprof.kernel import Uprof
from uprof.server import create_server
from uprof.settings import Settings

PLANNER = "app:planner"  # role:assistant in the seed policy
CALENDAR = "app:calendar"  # role:scheduler
PRIVACY = "app:privacy-console"  # role:dpo: erase and export
WHEN = "2025-01-01T09:00:00Z"


def api_settings(backend: Backend, *, background: bool) -> Settings:
    return Settings(
        data_dir=backend.data_dir / "data",
        database_url=backend.url if backend.kind == "postgres" else None,
        embedder="hashing",
        background_workers=background,
        read_wait_timeout_s=10.0,
    )


def build_kernel(settings: Settings) -> Uprof:
    return bootstrap(settings, embedder=HashingEmbedder(), extractor=FakeExtractor())


@pytest.fixture
def settings(backend: Backend) -> Settings:
    return api_settings(backend, background=True)


@pytest.fixture
def kernel(settings: Settings) -> Iterator[Uprof]:
    k = build_kernel(settings)
    try:
        yield k
    finally:
        k.close()


@pytest.fixture
def keys(settings: Settings) -> Iterator[ApiKeyStore]:
    store = ApiKeyStore.open(settings)
    try:
        yield store
    finally:
        store.close()


class _PromptServer(uvicorn.Server):
    """uvicorn's server, stopped as soon as it is told to.

    uvicorn checks ``should_exit`` every 0.1 s and then gives open connections 0.1 s to
    finish: ~0.17 s per stop, and ~300 tests stop a server. ``stop`` wakes the main loop
    at once (between stops the ticks, date header and request limits, run as in
    uvicorn), and with no connection or task left open the grace period is skipped.
    """

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.1)
            counter = (counter + 1) % 864000
            should_exit = await self.on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.server_state.connections or self.server_state.tasks:
            await super().shutdown(sockets)  # open connections: uvicorn's grace period
            return
        # Nothing open: uvicorn's shutdown would still sleep 0.1 s for connections to
        # finish; stop listening and run the app's lifespan shutdown as it does.
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for server in self.servers:
            await server.wait_closed()
        if not self.force_exit:
            await self.lifespan.shutdown()

    def stop(self) -> None:
        self.should_exit = True  # read by on_tick
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(wake.set)


class LiveServer:
    """uvicorn serving an ASGI app on 127.0.0.1 in a daemon thread."""

    def __init__(self, app: Any) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="on",
            access_log=False,
            log_config=server_log_config("warning"),
        )
        self._server = _PromptServer(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def __enter__(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()
        self._thread.join(15)
        self._sock.close()


@dataclass(frozen=True)
class Apps:
    """Keys for the apps the tests play."""

    planner: str
    planner_operator: str
    calendar: str
    privacy: str


@pytest.fixture
def other(settings: Settings, kernel: Uprof, tmp_path: Path) -> Iterator[tuple[Uprof, ApiKeyStore]]:
    """A second tenant on the same stores (the first tenant's kernel opened them), with
    the seed policy as its own."""
    there = settings.model_copy(
        update={"tenant": OTHER_TENANT, "policy_path": seed_policy_for(OTHER_TENANT, tmp_path)}
    )
    other_kernel = build_kernel(there)
    other_keys = ApiKeyStore.open(there)
    try:
        yield other_kernel, other_keys
    finally:
        other_keys.close()
        other_kernel.close()


@pytest.fixture
def apps(keys: ApiKeyStore) -> Apps:
    return Apps(
        planner=keys.create(PLANNER).token,
        planner_operator=keys.create(PLANNER, ["app", "operator"]).token,
        calendar=keys.create(CALENDAR).token,
        privacy=keys.create(PRIVACY).token,
    )


@pytest.fixture
def server(kernel: Uprof, keys: ApiKeyStore) -> Iterator[LiveServer]:
    with LiveServer(create_server(kernel, keys, max_body_bytes=64_000)) as live:
        yield live


#: The live server speaks plain HTTP on loopback, so no certificate is ever checked: the
#: clients share one default TLS context instead of each loading the CA bundle (~35 ms).
LOOPBACK_TLS = ssl.create_default_context()


@pytest.fixture
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30, verify=LOOPBACK_TLS) as client:
        yield client


def revoke_with_the_cli(settings: Settings, key_id: str) -> None:
    """``uprof apps revoke KEY_ID``, a process of its own on the same stores (a key
    revoked from outside the server under attack)."""
    cli = ["--data-dir", str(settings.data_dir), "--embedder", "hashing"]
    if settings.database_url:
        cli += ["--database-url", settings.database_url]
    script = "import sys\nfrom uprof.cli.main import app\napp(sys.argv[1:])"
    done = run_python(script, *cli, "apps", "revoke", key_id)
    assert done.returncode == 0, done.stdout + done.stderr


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def interaction(
    text: str,
    *,
    agent: str = "agent:one",
    sharing: str = "shared",
    purpose: str = "personalization",
    ref: str = "",
) -> dict[str, Any]:
    return {
        "agent_id": agent,
        "user_input": text,
        "occurred_at": WHEN,
        "sharing": sharing,
        "purpose": purpose,
        "source_ref": ref,
    }


def grant(
    http: httpx.Client,
    key: str,
    subject: str = "alice",
    categories: tuple[str, ...] = ("*",),
    purposes: tuple[str, ...] = ("personalization",),
) -> str:
    response = http.post(
        "/v1/consents",
        headers=bearer(key),
        json={
            "subject": subject,
            "categories": list(categories),
            "purposes": list(purposes),
            "collected_by": "consent-ui:test",
        },
    )
    assert response.status_code == 201, response.text
    return str(response.json()["consent_id"])


def now_iso() -> str:
    return datetime.now(tz=UTC).isoformat()


#: A keyed MCP ``capture`` of alice's by the planner's agent: the call the replay tests
#: send again, changed or as it is.
MCP_CAPTURE = {
    "subject": "alice",
    "agent_id": "agent:one",
    "user_input": "I like tea",
    "occurred_at": "2025-01-01T09:00:00+00:00",
    "idempotency_key": "m-1",
}


@contextlib.contextmanager
def planner_mcp_server(kernel: Uprof) -> Iterator[Any]:
    """An MCP server over a started runtime of ``kernel``, its stdio caller the planner
    app (as ``uprof mcp`` serves one app); the runtime stops when the block ends."""
    # Imported here: only the MCP tests pay for the mcp package's import.
    from uprof.api.runtime import ServiceRuntime
    from uprof.apikeys.store import Principal
    from uprof.mcp import build_server

    runtime = ServiceRuntime.for_kernel(kernel)
    runtime.start()
    try:
        yield build_server(runtime, stdio_principal=Principal(PLANNER, "k", frozenset({"app"})))
    finally:
        runtime.stop()


@contextlib.contextmanager
def tenant_servers(
    kernel: Uprof, keys: ApiKeyStore, other: tuple[Uprof, ApiKeyStore]
) -> Iterator[tuple[LiveServer, LiveServer, httpx.Client, httpx.Client]]:
    """Tenant A's server (``kernel``, ``keys``) and tenant B's (the ``other`` fixture) on
    one set of stores, live, with a client of each: ``(a_live, b_live, a, b)``."""
    other_kernel, other_keys = other
    with (
        LiveServer(create_server(kernel, keys)) as a_live,
        LiveServer(create_server(other_kernel, other_keys)) as b_live,
        httpx.Client(base_url=a_live.url, timeout=60) as a,
        httpx.Client(base_url=b_live.url, timeout=60) as b,
    ):
        yield a_live, b_live, a, b


class CountedAnswer:
    """An answer body of ``size`` bytes sent in pieces of ``chunk``, counting what the
    client pulled (an SDK that reads past its bound pulls more than bound + chunk)."""

    def __init__(self, size: int, chunk: int) -> None:
        self.size = size
        self.chunk = chunk
        self.pulled = 0

    def __iter__(self) -> Iterator[bytes]:
        sent = 0
        while sent < self.size:
            piece = b"x" * min(self.chunk, self.size - sent)
            sent += len(piece)
            self.pulled = sent
            yield piece


class AsyncCountedAnswer(httpx.AsyncByteStream):
    """``CountedAnswer`` for httpx's async transport."""

    def __init__(self, answer: CountedAnswer) -> None:
        self._answer = answer

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self._answer:
            await asyncio.sleep(0)
            yield piece
