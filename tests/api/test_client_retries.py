"""Writes a network failure makes a caller retry: the SDK and the adapters, through a proxy.

A loopback TCP proxy sits between the client and a live server (uvicorn on 127.0.0.1).
Armed, it lets the next request through, waits for the server's answer (so the write
was committed) and then drops the connection instead of forwarding it: the client sees
a network failure for a write that happened. A caller that retries on such a failure
(as every doc tells it to) must end with exactly one write stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx
import pytest

from tests.api.conftest import PLANNER, Apps, LiveServer, bearer, grant, interaction
from uprof.kernel import Uprof
from uprof.sdk import AsyncClient, Client, TransportError

T = TypeVar("T")
WHEN = datetime(2025, 1, 1, 9, tzinfo=UTC)


class DroppingProxy:
    """Forward 127.0.0.1:<port> to the server; ``arm()`` drops the next answer.

    The drop happens when the server's first byte of the answer arrives: the server has
    committed the write and answered, and the client gets a closed connection instead. A
    connection it cannot forward (no server listening) is closed at once."""

    def __init__(self, target_port: int) -> None:
        self._target = ("127.0.0.1", target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._armed = 0
        self.dropped = 0
        self._threads: list[threading.Thread] = []
        self._closing = False
        self._accepting = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> DroppingProxy:
        self._accepting.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing = True
        # Closing a listening socket does not wake a thread blocked in its accept() (Linux):
        # that thread, and this join, waited out its 10 s bound after every test. A
        # shutdown wakes it at once, with an OSError its loop ends on.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._accepting.join(10)
        assert not self._accepting.is_alive(), "the proxy's accepting thread did not end"

    def arm(self, answers: int = 1) -> None:
        with self._lock:
            self._armed = answers

    def _take_drop(self) -> bool:
        with self._lock:
            if self._armed > 0:
                self._armed -= 1
                self.dropped += 1
                return True
            return False

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._target)
            except OSError:
                client.close()  # nothing listening: the client sees the connection end
                continue
            for source, sink, answers in ((client, server, False), (server, client, True)):
                t = threading.Thread(target=self._pump, args=(source, sink, answers), daemon=True)
                t.start()

    def _pump(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if answers and self._take_drop():
                    break  # the answer never reaches the client
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


@pytest.fixture
def proxy(server: LiveServer) -> Iterator[DroppingProxy]:
    with DroppingProxy(int(server.url.rsplit(":", 1)[1])) as live:
        yield live


def stored(kernel: Uprof) -> Counter[str]:
    """The events in the log, by kind (the last part of their topic)."""
    notes = kernel.app.notifications_after(0, 100_000)
    return Counter(n.topic.rsplit(".", 1)[-1].rsplit(":", 1)[-1] for n in notes)


def retrying(call: Callable[[], T]) -> T:
    """What a caller does on a network failure: the docs tell it to retry, once here."""
    try:
        return call()
    except TransportError:
        return call()


def test_sdk_writes_through_a_dropped_answer_are_stored_once(
    proxy: DroppingProxy, kernel: Uprof, apps: Apps
) -> None:
    with Client(proxy.url, apps.planner) as client:
        proxy.arm()
        consent_id = retrying(
            lambda: client.grant_consent(
                "alice",
                categories=["*"],
                purposes=["personalization"],
                collected_by="consent-ui:test",
            )
        )
        proxy.arm()
        ack = retrying(
            lambda: client.capture("alice", agent_id="agent:one", user_input="I like tea")
        )
        proxy.arm()
        acks = retrying(
            lambda: client.capture_many(
                "alice",
                [
                    {"agent_id": "agent:one", "user_input": "I live in Lyon", "occurred_at": WHEN},
                    {"agent_id": "agent:one", "user_input": "I cycle", "occurred_at": WHEN},
                ],
            )
        )
        proxy.arm()
        applied = retrying(
            lambda: client.submit_proposals(
                "alice",
                [
                    {
                        "kind": "attribute",
                        "key": "likes",
                        "value": "tea",
                        "evidence": [ack.capture_id],
                    }
                ],
                agent_id="agent:one",
                sharing="shared",
            )
        )
        consents = client.consents("alice")
    assert proxy.dropped == 4
    assert [c.consent_id for c in consents] == [consent_id]
    assert len(acks) == 2 and applied == 1
    kinds = stored(kernel)
    assert kinds["InteractionCaptured"] == 3, kinds


def test_async_sdk_capture_through_a_dropped_answer_is_stored_once(
    proxy: DroppingProxy, kernel: Uprof, apps: Apps, http: httpx.Client
) -> None:
    grant(http, apps.planner)

    async def scenario() -> None:
        async with AsyncClient(proxy.url, apps.planner) as client:
            proxy.arm()
            try:
                await client.capture("alice", agent_id="agent:one", user_input="I like tea")
            except TransportError:
                await client.capture("alice", agent_id="agent:one", user_input="I like tea")

    asyncio.run(scenario())
    assert proxy.dropped == 1
    assert stored(kernel)["InteractionCaptured"] == 1


def test_openai_agents_capture_through_a_dropped_answer_is_stored_once(
    proxy: DroppingProxy, kernel: Uprof, apps: Apps, http: httpx.Client
) -> None:
    pytest.importorskip("agents")
    from agents.tool_context import ToolContext

    from uprof.integrations.openai_agents import UprofContext, uprof_tools

    grant(http, apps.planner)
    with Client(proxy.url, apps.planner) as client:
        tool = {t.name: t for t in uprof_tools(client, agent_id="agent:one")}["capture"]
        context = UprofContext(subject="alice")

        def invoke(call_id: str) -> dict[str, Any]:
            raw = json.dumps({"user_input": "I like tea"})
            ctx = ToolContext(
                context=context, tool_name=tool.name, tool_call_id=call_id, tool_arguments=raw
            )
            answer: dict[str, Any] = json.loads(asyncio.run(tool.on_invoke_tool(ctx, raw)))
            return answer

        proxy.arm()
        answer = invoke("call-1")
        if answer.get("error", {}).get("code") == "unavailable":
            answer = invoke("call-2")  # the model calls the tool again, as told to
    assert proxy.dropped == 1
    assert "captured" in answer, answer
    assert stored(kernel)["InteractionCaptured"] == 1


def test_langchain_history_through_a_dropped_answer_is_stored_once(
    proxy: DroppingProxy, kernel: Uprof, apps: Apps, http: httpx.Client
) -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.messages import AIMessage, HumanMessage

    from uprof.integrations.langchain import UprofChatMessageHistory

    grant(http, apps.planner)
    with Client(proxy.url, apps.planner) as client:
        history = UprofChatMessageHistory(client, "alice", agent_id="agent:one")
        turn = [HumanMessage("I like tea"), AIMessage("Noted.")]
        proxy.arm()
        retrying(lambda: history.add_messages(turn))
    assert proxy.dropped == 1
    assert stored(kernel)["InteractionCaptured"] == 1


def test_openai_agents_forget_through_a_dropped_answer_withdraws_once(
    proxy: DroppingProxy, kernel: Uprof, apps: Apps, http: httpx.Client
) -> None:
    pytest.importorskip("agents")
    from agents.tool_context import ToolContext

    from uprof.integrations.openai_agents import UprofContext, uprof_tools

    consent_id = grant(http, apps.planner)
    with Client(proxy.url, apps.planner) as client:
        tool = {t.name: t for t in uprof_tools(client, agent_id="agent:one")}["forget"]
        raw = json.dumps({"consent_id": consent_id})
        ctx = ToolContext(
            context=UprofContext(subject="alice"),
            tool_name=tool.name,
            tool_call_id="call-1",
            tool_arguments=raw,
        )
        proxy.arm()
        answer = json.loads(asyncio.run(tool.on_invoke_tool(ctx, raw)))
    assert proxy.dropped == 1
    assert answer.get("withdrawn") == [consent_id], answer


# ------------------------------------------------------------ keys across callers


def test_the_sdk_never_retries_an_unkeyed_write_or_a_refusal(
    proxy: DroppingProxy, kernel: Uprof, apps: Apps
) -> None:
    """An erasure takes no key: a dropped answer is the caller's to retry, never the SDK's."""
    privacy_key = apps.privacy
    with Client(proxy.url, apps.planner) as client:
        client.grant_consent(
            "alice", categories=["*"], purposes=["personalization"], collected_by="ui:test"
        )
        client.capture("alice", agent_id="agent:one", user_input="I like tea")
    before = stored(kernel)
    with Client(proxy.url, privacy_key) as client:
        proxy.arm()
        with pytest.raises(TransportError):
            client.erase_subject("alice")
    assert proxy.dropped == 1
    after = stored(kernel)
    assert after["SubjectErased"] == before["SubjectErased"] + 1


def test_a_key_replayed_by_another_tenant_gets_its_own_write(
    server: LiveServer, kernel: Uprof, apps: Apps, http: httpx.Client, other: Any
) -> None:
    other_kernel, other_keys = other
    grant(http, apps.planner)
    body = {"subject": "alice", **interaction("I like tea")}
    first = http.post(
        "/v1/captures", headers=bearer(apps.planner) | {"Idempotency-Key": "k-1"}, json=body
    )
    assert first.status_code == 201, first.text
    from tests.api.conftest import LiveServer as Live
    from uprof.server import create_server

    there_key = other_keys.create(PLANNER).token
    with Live(create_server(other_kernel, other_keys, max_body_bytes=64_000)) as there:
        with httpx.Client(base_url=there.url, timeout=30) as h2:
            grant(h2, there_key)
            second = h2.post(
                "/v1/captures",
                headers=bearer(there_key) | {"Idempotency-Key": "k-1"},
                json=body,
            )
    assert second.status_code == 201, second.text
    assert "Idempotent-Replayed" not in second.headers
    assert second.json()["capture_id"] != first.json()["capture_id"]


def test_a_key_reused_for_another_subject_is_refused_naming_the_header(
    http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    grant(http, apps.planner, "alice")
    grant(http, apps.planner, "bob")
    headers = bearer(apps.planner) | {"Idempotency-Key": "k-1"}
    first = http.post(
        "/v1/captures", headers=headers, json={"subject": "alice", **interaction("I like tea")}
    )
    again = http.post(
        "/v1/captures", headers=headers, json={"subject": "bob", **interaction("I like tea")}
    )
    assert first.status_code == 201
    assert again.status_code == 409, again.text
    error = again.json()["error"]
    assert error["code"] == "idempotency_key_reused"
    assert "Idempotency-Key" in error["message"]
    assert stored(kernel)["InteractionCaptured"] == 1


def test_mcp_capture_retried_with_its_key_through_a_dropped_answer_is_stored_once(
    kernel: Uprof, keys: Any
) -> None:
    """The MCP server cannot tell a host's retry from a new call (a new JSON-RPC id, the
    same arguments): the key is the caller's to send, and a retry with it is stored once."""
    from tests.api.mcp_messages import HELLO, POST_JSON, rpc
    from uprof.api.runtime import ServiceRuntime
    from uprof.mcp import build_server
    from uprof.mcp.server import http_app

    planner = keys.create(PLANNER).token
    kernel.grant_consent("alice", app_id=PLANNER, categories=["*"], purposes=["personalization"])
    runtime = ServiceRuntime.for_kernel(kernel)
    app = http_app(build_server(runtime, keys), path="/mcp")
    arguments = {
        "subject": "alice",
        "agent_id": "agent:one",
        "user_input": "I like tea",
        "occurred_at": "2025-01-01T09:00:00+00:00",
        "idempotency_key": "host-call-7",
    }
    runtime.start()
    try:
        with (
            LiveServer(app) as live,
            DroppingProxy(live.port) as proxy,
            httpx.Client(timeout=30) as client,
        ):
            url = f"{proxy.url}/mcp"
            own = {**POST_JSON, **bearer(planner)}
            opened = client.post(url, json=HELLO, headers=own)
            session = {**own, "mcp-session-id": opened.headers["mcp-session-id"]}
            client.post(url, content=rpc("notifications/initialized"), headers=session)
            call = {"name": "capture", "arguments": arguments}
            proxy.arm()
            with pytest.raises(httpx.TransportError):
                client.post(url, content=rpc("tools/call", 2, call), headers=session)
            again = client.post(url, content=rpc("tools/call", 3, call), headers=session)
    finally:
        runtime.stop()
    assert proxy.dropped == 1
    assert again.status_code == 200 and '"isError":true' not in again.text, again.text[:300]
    assert stored(kernel)["InteractionCaptured"] == 1


# ------------------------------------------------- a reused key names its field


def test_a_reused_key_is_refused_naming_the_field_the_caller_sent(
    kernel: Uprof, http: httpx.Client, apps: Apps
) -> None:
    """REST and the SDK name the header in ``error.fields``; the MCP tool names its own
    argument, ``idempotency_key``, never a header its caller did not send."""
    from mcp import Client as McpClient

    from tests.api.conftest import MCP_CAPTURE, planner_mcp_server

    grant(http, apps.planner)
    headers = bearer(apps.planner) | {"Idempotency-Key": "k-1"}
    http.post("/v1/captures", headers=headers, json={"subject": "alice", **interaction("a")})
    rest = http.post("/v1/captures", headers=headers, json={"subject": "alice", **interaction("b")})
    assert rest.status_code == 409
    assert [f["field"] for f in rest.json()["error"]["fields"]] == ["Idempotency-Key"]

    async def scenario(server: Any) -> Any:
        async with McpClient(server) as client:
            await client.call_tool("capture", MCP_CAPTURE)
            return await client.call_tool("capture", {**MCP_CAPTURE, "user_input": "I like coffee"})

    with planner_mcp_server(kernel) as server:
        reused = asyncio.run(scenario(server))
    assert reused.is_error
    error = json.loads(reused.content[0].text)["error"]
    assert error["code"] == "idempotency_key_reused"
    assert [f["field"] for f in error["fields"]] == ["idempotency_key"], error
    assert "Idempotency-Key" not in error["message"] + error["hint"], error
