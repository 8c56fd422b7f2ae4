"""OpenAI Agents SDK tools: the profile slice, capture and forget, through the uprof SDK.

Needs the ``openai-agents`` extra. The tools call a ``uprof.sdk.Client`` (HTTP with the
app's API key, or ``Client.embedded``), so the app is the key's and every call passes
the consent gate and the policy exactly as over REST: an app the policy does not allow
gets a refusal, never data.

The subject is **not** a tool argument: the model never chooses whose profile it reads
or writes. The app names the user it is serving in the run's context::

    agent = Agent(name="assistant", tools=uprof_tools(client, agent_id="agent:one"))
    await Runner.run(agent, "plan my week", context=UprofContext(subject="alice"))

A refused call comes back to the model as the REST error body (JSON with ``code``,
``message`` and ``hint``), so it can tell the user why, instead of an opaque failure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from agents import FunctionTool, RunContextWrapper, function_tool

from uprof.sdk import APIError, Client, TransportError

__all__ = ["UprofContext", "uprof_tools"]


@dataclass
class UprofContext:
    """What the app knows about the run: whom it serves (never chosen by the model)."""

    subject: str
    session_id: str = ""
    #: Acks of what the capture tool stored during the run (ids, log positions).
    captured: list[Any] = field(default_factory=list)


def _refusal(ctx: RunContextWrapper[Any], error: Exception) -> str:
    """The text the model sees when a call is refused or fails."""
    if isinstance(error, APIError):
        body: dict[str, Any] = {"code": error.code, "message": error.message, "hint": error.hint}
        if error.fields:
            body["fields"] = [f.field for f in error.fields]
        return json.dumps({"error": body})
    if isinstance(error, TransportError):
        return json.dumps({"error": {"code": "unavailable", "message": str(error)}})
    return json.dumps({"error": {"code": "tool_failed", "message": type(error).__name__}})


def _subject(ctx: RunContextWrapper[Any]) -> UprofContext:
    context = ctx.context
    if not isinstance(context, UprofContext):
        raise TypeError("run the agent with context=UprofContext(subject=...)")
    return context


def uprof_tools(
    client: Client,
    *,
    agent_id: str,
    purpose: str = "personalization",
    budget_tokens: int = 512,
    sharing: str = "private",
    agent_type: str = "",
) -> list[FunctionTool]:
    """The three tools, bound to one app's client and one of its agents."""

    @function_tool(failure_error_function=_refusal)
    def profile_slice(ctx: RunContextWrapper[UprofContext], query: str) -> str:
        """Read what this app may use of the user's profile for a query.

        Args:
            query: What you are about to answer or do for the user.
        """
        piece = client.slice(
            _subject(ctx).subject,
            query,
            budget_tokens=budget_tokens,
            purpose=purpose,
            agent_id=agent_id,
            agent_type=agent_type,
        )
        items = [
            {
                "text": i.text,
                "layer": i.layer,
                "category": i.category,
                "confidence": i.confidence,
                "provenance": i.provenance,
                "evidence": i.evidence,
            }
            for i in piece.items
        ]
        answer: dict[str, Any] = {
            "text": piece.text,
            "items": items,
            "withheld": piece.withheld,
            "fresh": piece.fresh,
        }
        if not piece.fresh:
            # I7: the wait for the user's newest words ran out; the model must not take
            # this (maybe empty) profile for the current one.
            answer["note"] = (
                "this profile may miss what the user said most recently (uprof could not "
                "wait for it); do not treat it as complete"
            )
        return json.dumps(answer)

    @function_tool(failure_error_function=_refusal)
    def capture(
        ctx: RunContextWrapper[UprofContext], user_input: str, agent_response: str = ""
    ) -> str:
        """Remember something the user said in this conversation (needs their consent).

        Args:
            user_input: What the user said, in their words.
            agent_response: What you answered, if it matters.
        """
        context = _subject(ctx)
        ack = client.capture(
            context.subject,
            agent_id=agent_id,
            agent_type=agent_type,
            user_input=user_input,
            agent_response=agent_response,
            occurred_at=datetime.now(tz=UTC),
            session_id=context.session_id,
            purpose=purpose,
            sharing=sharing,
        )
        context.captured.append(ack)
        return json.dumps({"captured": ack.capture_id})

    @function_tool(failure_error_function=_refusal)
    def forget(
        ctx: RunContextWrapper[UprofContext], consent_id: str | None = None, erase: bool = False
    ) -> str:
        """Stop using what the user shared with this app: withdraw its consent(s).

        Args:
            consent_id: One consent to withdraw; leave empty for all of this app's.
            erase: Also erase what was collected under them (signed receipts).
        """
        subject = _subject(ctx).subject
        if consent_id is None:
            live = client.iter_consents(subject)
            targets = [c.consent_id for c in live if c.withdrawn_at is None]
        else:  # the server refuses an id that is not one of this app's consents in force
            targets = [consent_id]
        withdrawn, receipts = [], []
        for target in targets:
            done = client.withdraw_consent(subject, target, erase=erase)
            withdrawn.append(done.consent.consent_id)
            body = done.erasure.receipt.get("body") if done.erasure is not None else None
            if isinstance(body, dict):
                receipts.append(body["receipt_id"])
        return json.dumps({"withdrawn": withdrawn, "erasure_receipts": receipts})

    return [_refusing_undeclared(tool) for tool in (profile_slice, capture, forget)]


def _refusing_undeclared(tool: FunctionTool) -> FunctionTool:
    """The tool, answering a call with an argument it does not declare with a refusal that
    names it (the SDK would drop it and run the call), as REST refuses an unknown field
    and the MCP server an unknown argument: a model or a caller that passes ``subject`` or
    ``app_id`` must learn that it chose nothing."""
    declared = set(tool.params_json_schema.get("properties", {}))
    invoke = tool.on_invoke_tool

    async def on_invoke_tool(ctx: Any, raw: str) -> Any:
        try:
            arguments = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            arguments = None  # the SDK's own parsing answers it
        if isinstance(arguments, dict):
            unknown = sorted(set(arguments) - declared)
            if unknown:
                return json.dumps(
                    {
                        "error": {
                            "code": "invalid_request",
                            "message": "; ".join(
                                f"{name}: this tool takes no such argument" for name in unknown
                            ),
                            "hint": "call the tool with its declared arguments only",
                            "fields": unknown,
                        }
                    }
                )
        return await invoke(ctx, raw)

    return replace(tool, on_invoke_tool=on_invoke_tool)
