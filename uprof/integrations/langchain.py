"""LangChain adapters: a profile-slice retriever and a chat history that captures messages.

Needs the ``langchain`` extra (``langchain-core``). Both take a ``uprof.sdk.Client`` (HTTP
with the app's API key, or ``Client.embedded``): the app is the key's, so the consent
gate, the policy and the sharing rules apply to every read and write exactly as over REST.

>>> # retriever = UprofRetriever(client=client, subject="alice", agent_id="agent:one",
>>> #                            purpose="personalization", budget_tokens=256)
>>> # retriever.invoke("what should I cook tonight?")  # -> [Document, ...]
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict

from uprof.sdk import Client, ProfileSlice, ServiceUnavailableError

__all__ = ["UprofChatMessageHistory", "UprofRetriever", "documents_of"]


def documents_of(piece: ProfileSlice, *, subject: str, purpose: str) -> list[Document]:
    """One ``Document`` per slice item, its provenance in ``metadata``.

    ``evidence`` holds the ids of the captured events the item came from and
    ``source_refs`` the apps' own references to them, so an answer built on a document
    can be traced back to what the user said.
    """
    return [
        Document(
            page_content=item.text,
            id=item.item_id,
            metadata={
                "source": "uprof",
                "subject": subject,
                "purpose": purpose,
                "item_id": item.item_id,
                "layer": item.layer,
                "category": item.category,
                "confidence": item.confidence,
                "provenance": item.provenance,
                "status": item.status,
                "evidence": list(item.evidence),
                "source_refs": list(item.source_refs),
                "slice_fresh": piece.fresh,
            },
        )
        for item in piece.items
    ]


class UprofRetriever(BaseRetriever):
    """The slice of a subject's profile this app may use for a query, as documents.

    What the policy, consent or sharing withhold never reaches the documents (they are
    counted in the slice's ``withheld``; ``last_slice`` keeps the last slice served).

    A slice served without the subject's newest writes (``fresh`` false: the wait for the
    workers ran out, I7) raises ``ServiceUnavailableError`` ``read_timeout``, as a
    whole-view read does: a chain must not answer from it as if it were current (an empty
    one would look like "nothing known"). ``allow_stale=True`` returns its documents, each
    with ``slice_fresh`` False in its metadata.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: Client
    subject: str
    agent_id: str
    purpose: str = "personalization"
    budget_tokens: int = 512
    agent_type: str = ""
    allow_stale: bool = False
    last_slice: ProfileSlice | None = None

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        piece = self.client.slice(
            self.subject,
            query,
            budget_tokens=self.budget_tokens,
            purpose=self.purpose,
            agent_id=self.agent_id,
            agent_type=self.agent_type,
        )
        self.last_slice = piece
        if not piece.fresh and not self.allow_stale:
            raise ServiceUnavailableError(
                503,
                "read_timeout",
                f"the slice could not wait for the subject's newest writes "
                f"(waited {piece.waited_ms:.0f} ms): it may miss what they said last",
                hint="retry when the workers have caught up, or set allow_stale=True to "
                "use it anyway (each document's slice_fresh says so)",
            )
        return documents_of(piece, subject=self.subject, purpose=self.purpose)


class UprofChatMessageHistory(BaseChatMessageHistory):
    """A chat history whose messages are captured into the subject's profile.

    Each human message and the AI messages after it become one interaction (a capture
    through the consent gate; no consent means ``PermissionDeniedError`` and nothing is
    kept). System and tool messages are not captured. ``messages`` holds what this
    object added, in order: uprof keeps what is learnt from a conversation, not its
    transcript, and an app cannot read other apps' captures back. ``clear`` forgets the
    local copy only; erasing from uprof is a governed action (``Client.erase_*``).
    """

    def __init__(
        self,
        client: Client,
        subject: str,
        *,
        agent_id: str,
        session_id: str = "",
        purpose: str = "personalization",
        sharing: str = "private",
        agent_type: str = "",
    ) -> None:
        self.client = client
        self.subject = subject
        self.agent_id = agent_id
        self.session_id = session_id
        self.purpose = purpose
        self.sharing = sharing
        self.agent_type = agent_type
        self.messages: list[BaseMessage] = []
        #: The capture acks of what was added (ids, log positions).
        self.captured: list[Any] = []

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        turns = _turns(messages)
        if turns:
            now = datetime.now(tz=UTC)
            acks = self.client.capture_many(
                self.subject,
                [
                    {
                        "agent_id": self.agent_id,
                        "agent_type": self.agent_type,
                        "user_input": user,
                        "agent_response": answer,
                        "occurred_at": now,
                        "session_id": self.session_id,
                        "purpose": self.purpose,
                        "sharing": self.sharing,
                    }
                    for user, answer in turns
                ],
            )
            self.captured.extend(acks)
        self.messages.extend(messages)

    def clear(self) -> None:
        self.messages = []


def _text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    parts = [
        p if isinstance(p, str) else str(p.get("text", ""))
        for p in content
        if isinstance(p, str) or (isinstance(p, dict) and p.get("type") == "text")
    ]
    return "\n".join(p for p in parts if p)


def _turns(messages: Sequence[BaseMessage]) -> list[tuple[str, str]]:
    """(what the user said, what the AI answered) pairs, in order; empty ones dropped."""
    turns: list[tuple[str, str]] = []
    user: str | None = None
    answer = ""
    for message in messages:
        if isinstance(message, HumanMessage):
            if user is not None or answer:
                turns.append((user or "", answer))
            user, answer = _text(message), ""
        elif isinstance(message, AIMessage):
            text = _text(message)
            answer = f"{answer}\n{text}" if answer and text else (answer or text)
    if user is not None or answer:
        turns.append((user or "", answer))
    return [(u, a) for u, a in turns if u.strip() or a.strip()]
