"""The OpenAI Agents SDK tools, called as the SDK calls them (no model, no network).

Each tool object's ``on_invoke_tool`` runs with a ``ToolContext`` as the Runner would
build it; sockets reach loopback only, so a call to a model's API fails the test. The
tools go through an embedded uprof client: an app the policy does not allow is refused, and so is a
capture without consent; the subject comes from the run context, never from the model.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from pytest_socket import _remove_restrictions, socket_allow_hosts

pytest.importorskip("agents")

from agents import FunctionTool
from agents.tool_context import ToolContext

from uprof.integrations.openai_agents import UprofContext, uprof_tools
from uprof.kernel import Uprof
from uprof.sdk import Client


@pytest.fixture(autouse=True)
def no_network() -> Iterator[None]:
    """Loopback only (the PostgreSQL backend): any call to a model's API would fail."""
    socket_allow_hosts(["127.0.0.1", "::1"], allow_unix_socket=True)
    try:
        yield
    finally:
        _remove_restrictions()


def call(tool: FunctionTool, context: UprofContext, **arguments: Any) -> Any:
    raw = json.dumps(arguments)
    ctx = ToolContext(
        context=context, tool_name=tool.name, tool_call_id="call-1", tool_arguments=raw
    )
    return json.loads(asyncio.run(tool.on_invoke_tool(ctx, raw)))


def tools_for(kernel: Uprof, app_id: str) -> dict[str, FunctionTool]:
    client = Client.embedded(kernel, app_id)
    return {t.name: t for t in uprof_tools(client, agent_id="agent:one", sharing="shared")}


def test_the_tools_capture_slice_and_forget_under_consent(kernel: Uprof) -> None:
    tools = tools_for(kernel, "app:planner")
    assert set(tools) == {"profile_slice", "capture", "forget"}
    # The model is never asked whose profile: no tool takes a subject.
    for tool in tools.values():
        assert "subject" not in tool.params_json_schema["properties"]
    alice = UprofContext(subject="alice", session_id="s-1")
    refused = call(tools["capture"], alice, user_input="I live in Lisbon")
    assert refused["error"]["code"] == "consent_required"
    kernel.grant_consent(
        "alice", app_id="app:planner", categories=["*"], purposes=["personalization"]
    )
    stored = call(tools["capture"], alice, user_input="I love jazz music")
    assert stored["captured"] == alice.captured[0].capture_id
    piece = call(tools["profile_slice"], alice, query="what music do I love?")
    assert any("jazz" in item["text"] for item in piece["items"])
    assert all(item["evidence"] for item in piece["items"])
    forgotten = call(tools["forget"], alice)
    assert len(forgotten["withdrawn"]) == 1
    after = call(tools["capture"], alice, user_input="I also like tea")
    assert after["error"]["code"] == "consent_required"


def test_an_app_without_policy_gets_a_refusal_not_data(kernel: Uprof) -> None:
    kernel.grant_consent(
        "alice", app_id="app:planner", categories=["*"], purposes=["personalization"]
    )
    planner = tools_for(kernel, "app:planner")
    stored = call(planner["capture"], UprofContext("alice"), user_input="I love jazz music")
    assert "captured" in stored
    rogue = tools_for(kernel, "app:rogue")
    alice = UprofContext(subject="alice")
    # It holds no consent of alice: every answer is the one for an unknown subject.
    nobody = UprofContext(subject="nobody-at-all")
    for tool, args in (
        ("profile_slice", {"query": "what music does alice love?"}),
        ("forget", {}),
    ):
        refused = call(rogue[tool], alice, **args)
        assert refused["error"]["code"] == "subject_not_found", refused
        assert refused == call(rogue[tool], nobody, **args)
    denied = call(rogue["capture"], alice, user_input="alice lives in Porto")
    assert denied["error"]["code"] in ("permission_denied", "consent_required")


def test_an_argument_a_tool_does_not_declare_is_refused_by_name(kernel: Uprof) -> None:
    """The SDK drops undeclared arguments and runs the call: a caller passing ``subject``
    would read alice's slice while believing it chose bob's."""
    kernel.grant_consent(
        "alice", app_id="app:planner", categories=["*"], purposes=["personalization"]
    )
    tools = tools_for(kernel, "app:planner")
    alice = UprofContext(subject="alice")
    assert "captured" in call(tools["capture"], alice, user_input="I love jazz music")
    for tool, args in (
        ("profile_slice", {"query": "music?", "subject": "bob"}),
        ("capture", {"user_input": "I moved to Porto", "app_id": "app:other"}),
        ("forget", {"subject": "bob"}),
    ):
        refused = call(tools[tool], alice, **args)
        assert refused["error"]["code"] == "invalid_request", refused
        assert refused["error"]["fields"] == [next(k for k in args if k in ("subject", "app_id"))]
    # Nothing ran: no capture about Porto, alice's consent still in force.
    assert len(alice.captured) == 1
    assert call(tools["profile_slice"], alice, query="music?")["items"]


def test_forgetting_a_consent_that_is_not_in_force_is_refused_not_reported_done(
    kernel: Uprof,
) -> None:
    consent_id = kernel.grant_consent(
        "alice", app_id="app:planner", categories=["*"], purposes=["personalization"]
    )
    tools = tools_for(kernel, "app:planner")
    alice = UprofContext(subject="alice")
    unknown = call(tools["forget"], alice, consent_id="cons_not_a_real_one")
    assert "error" in unknown and "withdrawn" not in unknown, unknown
    assert call(tools["forget"], alice, consent_id=consent_id)["withdrawn"] == [consent_id]
    again = call(tools["forget"], alice, consent_id=consent_id)
    assert "error" in again and "withdrawn" not in again, again


def test_a_run_without_a_subject_in_context_is_refused(kernel: Uprof) -> None:
    tools = tools_for(kernel, "app:planner")
    raw = json.dumps({"query": "anything"})
    ctx = ToolContext(context=None, tool_name="profile_slice", tool_call_id="c", tool_arguments=raw)
    answer = json.loads(asyncio.run(tools["profile_slice"].on_invoke_tool(ctx, raw)))
    assert answer["error"]["code"] == "tool_failed"


def test_the_network_is_closed_but_loopback(kernel: Uprof) -> None:
    import socket

    from pytest_socket import SocketConnectBlockedError

    with (
        pytest.warns(UserWarning, match="192.0.2.1"),
        pytest.raises(SocketConnectBlockedError),
    ):
        socket.create_connection(("192.0.2.1", 443), timeout=1)  # TEST-NET-1, never routed


def test_a_slice_served_stale_says_so_to_the_model() -> None:
    """Bug IB: a slice whose read-your-writes wait ran out is served with ``fresh: false``
    (I7, tests/kernel/test_freshness.py); the tool dropped the flag, so the model took a
    profile without the user's newest words (here: an empty one) for the current one. The
    LangChain retriever keeps it (``slice_fresh``, ``last_slice``).

    The client is a stand-in serving what the kernel serves when its workers are stuck
    (an embedded client starts its own worker, so a real one cannot be held stale)."""
    from uprof.sdk import ProfileSlice

    def stale(fresh: bool) -> ProfileSlice:
        return ProfileSlice(
            text="",
            n_tokens=0,
            budget_tokens=512,
            items=[],
            left_out=[],
            withheld={},
            fresh=fresh,
            waited_ms=200.0,
            purpose="personalization",
            app_id="app:planner",
            subject_pseudonym="subj_" + "0" * 32,
        )

    class Stalled:
        fresh = False

        def slice(self, subject: str, query: str, **options: Any) -> ProfileSlice:
            return stale(self.fresh)

    client = Stalled()
    tools = {t.name: t for t in uprof_tools(client, agent_id="agent:one")}  # type: ignore[arg-type]
    alice = UprofContext(subject="alice")
    piece = call(tools["profile_slice"], alice, query="where do I live?")
    assert piece.get("fresh") is False, piece
    assert "note" in piece
    client.fresh = True
    served = call(tools["profile_slice"], alice, query="where do I live?")
    assert served["fresh"] is True and "note" not in served


def test_forgetting_every_consent_with_erase_withdraws_each_and_says_so(kernel: Uprof) -> None:
    """An app holding two consents of alice: ``forget(erase=True)`` withdraws both, or says
    which it withdrew before it failed (never a bare failure after a withdrawal)."""
    for purpose in ("personalization", "analytics"):
        kernel.grant_consent("alice", app_id="app:planner", categories=["*"], purposes=[purpose])
    tools = tools_for(kernel, "app:planner")
    alice = UprofContext(subject="alice")
    assert "captured" in call(tools["capture"], alice, user_input="I love jazz music")
    done = call(tools["forget"], alice, erase=True)
    assert len(done.get("withdrawn", [])) == 2, done


def test_forget_withdraws_only_this_apps_consents(kernel: Uprof) -> None:
    """Held: with another app's consent of alice in force, ``forget()`` withdraws this
    app's and reports them; the other app's consent stays in force."""
    mine = kernel.grant_consent(
        "alice", app_id="app:planner", categories=["*"], purposes=["personalization"]
    )
    theirs = kernel.grant_consent(
        "alice", app_id="app:calendar", categories=["*"], purposes=["personalization"]
    )
    done = call(tools_for(kernel, "app:planner")["forget"], UprofContext("alice"))
    assert done == {"withdrawn": [mine], "erasure_receipts": []}, done
    assert [g.consent_id for g in kernel.consents_in_force("alice")] == [theirs]
