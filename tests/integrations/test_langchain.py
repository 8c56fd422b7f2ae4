"""The LangChain retriever and chat history over an embedded uprof client (offline)."""

from __future__ import annotations

import pytest

pytest.importorskip("langchain_core")

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from uprof.integrations.langchain import UprofChatMessageHistory, UprofRetriever
from uprof.kernel import Uprof
from uprof.sdk import Client, NotFoundError, PermissionDeniedError


def test_history_captures_turns_and_the_retriever_returns_them_with_provenance(
    kernel: Uprof,
) -> None:
    kernel.grant_consent(
        "alice", app_id="app:planner", categories=["*"], purposes=["personalization"]
    )
    client = Client.embedded(kernel, "app:planner")
    history = UprofChatMessageHistory(
        client, "alice", agent_id="agent:one", session_id="s-1", sharing="shared"
    )
    history.add_messages(
        [
            SystemMessage("be brief"),
            HumanMessage("I love jazz music"),
            AIMessage("Noted: jazz."),
            HumanMessage("I play the cello every weekend"),
            AIMessage("Lovely."),
        ]
    )
    assert len(history.captured) == 2 and len(history.messages) == 5
    retriever = UprofRetriever(
        client=client, subject="alice", agent_id="agent:one", budget_tokens=256
    )
    documents = retriever.invoke("what music do I love?")
    jazz = [d for d in documents if "jazz" in d.page_content]
    assert jazz, [d.page_content for d in documents]
    meta = jazz[0].metadata
    assert meta["source"] == "uprof" and meta["subject"] == "alice"
    captured_ids = {a.capture_id for a in history.captured}
    assert set(meta["evidence"]) <= captured_ids and meta["evidence"]
    assert meta["layer"] and meta["provenance"] and jazz[0].id == meta["item_id"]
    history.clear()
    assert history.messages == []


def test_without_consent_nothing_is_captured_and_another_app_reads_nothing(
    kernel: Uprof,
) -> None:
    client = Client.embedded(kernel, "app:planner")
    history = UprofChatMessageHistory(client, "alice", agent_id="agent:one")
    with pytest.raises(PermissionDeniedError):
        history.add_messages([HumanMessage("I love jazz music")])
    assert history.captured == [] and history.messages == []
    kernel.grant_consent(
        "alice", app_id="app:planner", categories=["*"], purposes=["personalization"]
    )
    history.add_messages([HumanMessage("I love jazz music"), AIMessage("ok")])
    rogue = UprofRetriever(
        client=Client.embedded(kernel, "app:rogue"), subject="alice", agent_id="agent:one"
    )
    # It holds no consent of alice: answered as for a subject that does not exist.
    with pytest.raises(NotFoundError):
        rogue.invoke("what music does alice love?")
    assert rogue.last_slice is None


def test_a_stale_slice_is_refused_unless_the_app_accepts_it() -> None:
    """Bug ID: a slice whose read-your-writes wait ran out (``fresh: false``, I7) came back
    as documents like any other, and an empty one as ``[]``: the chain could not tell "uprof
    knows nothing of this user" from "uprof could not wait for what they just said", and
    answered from a profile missing it. The retriever now raises the 503 ``read_timeout``
    that whole-view reads raise; ``allow_stale=True`` serves it (``slice_fresh`` False).

    The client is a stand-in serving what the kernel serves when its workers are stuck
    (an embedded client starts its own worker, so a real one cannot be held stale)."""
    from typing import Any

    from uprof.sdk import ProfileSlice, ServiceUnavailableError

    class Stalled(Client):
        def __init__(self) -> None:  # no backend: only ``slice`` is called
            pass

        def slice(self, subject: str, query: str, **options: Any) -> ProfileSlice:
            return ProfileSlice(
                text="",
                n_tokens=0,
                budget_tokens=256,
                items=[],
                left_out=[],
                withheld={},
                fresh=False,
                waited_ms=200.0,
                purpose="personalization",
                app_id="app:planner",
                subject_pseudonym="subj_" + "0" * 32,
            )

    client = Stalled()
    retriever = UprofRetriever(client=client, subject="alice", agent_id="agent:one")
    with pytest.raises(ServiceUnavailableError) as refused:
        retriever.invoke("where do I live?")
    assert refused.value.code == "read_timeout"
    assert retriever.last_slice is not None and retriever.last_slice.fresh is False
    lenient = UprofRetriever(client=client, subject="alice", agent_id="agent:one", allow_stale=True)
    assert lenient.invoke("where do I live?") == []
