"""Extraction through any OpenAI-compatible chat server (Ollama, vLLM, llama.cpp, ...).

The model is asked for one strict JSON object; the answer is parsed item by
item, so one malformed item costs that item only. Items with unknown keys or
categories, or with fields of the wrong shape, are dropped and counted in
``batch.extras["dropped"]``. Evidence is never taken from the model: every
proposal cites the capture id, which the model is not even shown.

Transport failures (timeouts, refused connections, HTTP errors, an answer that
is not JSON) raise :class:`ExtractionError`; the caller decides whether to retry.
With ``fallback=`` set (e.g. a :class:`RuleBasedExtractor`), the fallback's batch
is returned instead, marked in ``extras``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from domain.catalogue import CATALOGUE, Catalogue
from domain.values import (
    ATTRIBUTE_KEYS,
    CATEGORIES,
    DEFAULT_CONFIDENCE,
    AttributeProposal,
    CapturedInteraction,
    IntentProposal,
    IntentStatus,
    IntentUpdateProposal,
    MemoryProposal,
    Proposal,
    ProposalBatch,
)
from uprof.adapters.extraction.engine import REPORTED_CONFIDENCE
from uprof.adapters.extraction.errors import ExtractionError
from uprof.adapters.extraction.rules import DEFAULT_MEMORY_MAX_CHARS, truncate
from uprof.adapters.extraction.speaker import speaker_of
from uprof.ports import Extractor

#: Longest user text sent to the model; the rest of a pasted document adds cost, not facts.
MAX_INPUT_CHARS = 8_000
#: Longest attribute value or intent description accepted from the model.
MAX_VALUE_CHARS = 200


def system_prompt(catalogue: Catalogue) -> str:
    """The system prompt for a catalogue: one line per attribute key (its description),
    in ``Catalogue.keys()`` order, and the catalogue's categories for intents."""
    return (
        _PROMPT_HEAD
        + _key_lines(catalogue)
        + _PROMPT_RULES.format(categories=", ".join(catalogue.categories))
    )


def _key_lines(catalogue: Catalogue) -> str:
    return "\n".join(f"- {key.name}: {key.description}" for key, _ in catalogue.keys())


_PROMPT_HEAD = (
    "You extract a user profile from one turn of a conversation between a user and an AI "
    "agent. Report only what the USER states about THEMSELVES in the user's message. The "
    "agent's reply, if shown, is context only: never report anything only the agent said, and "
    "never report facts about other people as the user's. Do not guess; when nothing applies, "
    "return empty lists and a null memory.\n\n"
    "Answer with exactly one JSON object and nothing else:\n"
    '{"attributes": [{"key": string, "value": string, "confidence": number 0-1, '
    '"explicit": boolean, "supersedes": boolean, "negated": boolean}],\n'
    ' "intents": [{"description": string, "category": string, "confidence": number 0-1, '
    '"expires_at": ISO-8601 datetime or null}],\n'
    ' "intent_updates": [{"status": "fulfilled" or "abandoned", "description": string}],\n'
    ' "memory": {"text": string, "importance": number 0-1} or null}\n\n'
    "Attribute keys (use only these):\n"
)
_PROMPT_RULES = (
    "\n\nRules:\n"
    "- value: short and normalised ('Berlin', 'software engineer'); lower-case except proper "
    "nouns.\n"
    "- explicit: true when the user said it outright, false when you inferred it.\n"
    "- supersedes: true when the user says a previous value changed ('I moved to Lisbon').\n"
    "- negated: true when the user says it does not or no longer hold ('I no longer live in "
    "Paris').\n"
    "- intents: plans and goals in base form ('run a marathon'); category is one of: "
    "{categories}; expires_at only when the user names a time, computed from the turn time given.\n"
    "- intent_updates: a plan the user finished (fulfilled) or gave up (abandoned), described "
    "the way the plan was.\n"
    "- memory: one concise rendering of what the user said, in their own words; null for "
    "greetings, thanks and small talk.\n"
    "- Output no ids, evidence, sources or any field not listed above."
)
SYSTEM_PROMPT = system_prompt(CATALOGUE)

#: Keys a model may add to claim where a fact came from; always ignored, counted.
_EVIDENCE_KEYS = frozenset(
    {
        "evidence",
        "evidence_ids",
        "capture_id",
        "capture_ids",
        "event_id",
        "event_ids",
        "source",
        "sources",
    }
)
_FENCE_RE = re.compile(r"^\s*```(?:json)?\s*|\s*```\s*$", re.IGNORECASE)


# --- The shapes we accept from the model -----------------------------------------------


class _Item(BaseModel):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    @field_validator("confidence", "importance", check_fields=False)
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("not a finite number")
        return min(max(v, 0.0), 1.0)


class _AttributeItem(_Item):
    key: str
    value: str = Field(min_length=1, max_length=MAX_VALUE_CHARS)
    confidence: float = DEFAULT_CONFIDENCE
    explicit: bool = True
    supersedes: bool = False
    negated: bool = False

    @field_validator("value", mode="before")
    @classmethod
    def _scalar(cls, v: Any) -> Any:
        # Ages come back as numbers; lists, objects and booleans are malformed.
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise ValueError("value must be a string or a number")
        return str(v)

    @field_validator("key")
    @classmethod
    def _known_key(cls, v: str) -> str:
        if v not in ATTRIBUTE_KEYS:
            raise ValueError(f"unknown attribute key {v!r}")
        return v


class _IntentItem(_Item):
    description: str = Field(min_length=1, max_length=MAX_VALUE_CHARS)
    category: str = "goal"
    confidence: float = DEFAULT_CONFIDENCE
    expires_at: datetime | None = None

    @field_validator("category")
    @classmethod
    def _known_category(cls, v: str) -> str:
        if v not in CATEGORIES:
            raise ValueError(f"unknown category {v!r}")
        return v


class _UpdateItem(_Item):
    status: IntentStatus
    description: str = Field(min_length=1, max_length=MAX_VALUE_CHARS)

    @field_validator("status")
    @classmethod
    def _user_settable(cls, v: IntentStatus) -> IntentStatus:
        if v not in (IntentStatus.FULFILLED, IntentStatus.ABANDONED):
            raise ValueError("a user can only fulfil or abandon a plan")
        return v


class _MemoryItem(_Item):
    text: str = Field(min_length=1)
    importance: float = 0.5


class _Message(BaseModel):
    content: str | None = None


class _Choice(BaseModel):
    message: _Message


class _Envelope(BaseModel):
    choices: list[_Choice] = Field(min_length=1)


# --- The extractor ------------------------------------------------------------------------


class OpenAICompatibleExtractor:
    """An ``Extractor`` that asks an OpenAI-compatible ``/chat/completions`` endpoint.

    ``base_url`` is the API root, e.g. ``http://127.0.0.1:11434/v1`` for Ollama.
    Pass ``client`` to share a connection pool (it is then not closed here);
    otherwise the extractor owns one and :meth:`close` releases it.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 30.0,
        client: httpx.Client | None = None,
        fallback: Extractor | None = None,
        temperature: float = 0.0,
        include_agent_reply: bool = True,
        memory_max_chars: int = DEFAULT_MEMORY_MAX_CHARS,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if not model.strip():
            raise ValueError("model must name the model to call")
        if not timeout_s > 0:
            raise ValueError("timeout_s must be positive")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = f"llm:{model}"
        self.author = f"llm/{model}"
        self.timeout_s = timeout_s
        self.temperature = temperature
        self.include_agent_reply = include_agent_reply
        self.memory_max_chars = memory_max_chars
        self.fallback = fallback
        self._api_key = api_key
        self._owns_client = client is None
        self._client = client if client is not None else httpx.Client(timeout=timeout_s)

    # Context-manager plumbing, so a composition root can scope the HTTP pool.
    def close(self) -> None:
        """Close the HTTP client if this extractor created it."""
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> OpenAICompatibleExtractor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def extract(self, capture: CapturedInteraction) -> ProposalBatch:
        """Ask the model; on failure use the fallback if one is configured, else raise."""
        try:
            return self._extract(capture)
        except ExtractionError as exc:
            if self.fallback is None:
                raise
            batch = self.fallback.extract(capture)
            extras = {
                **batch.extras,
                "fallback_from": self.author,
                "fallback_reason": str(exc)[:200],
            }
            return replace(batch, extras=extras)

    def _extract(self, capture: CapturedInteraction) -> ProposalBatch:
        interaction = capture.interaction
        if not interaction.user_input.strip():
            return self._batch(capture, (), dropped=0, ignored_evidence=0)
        answer = self._post(self._payload(capture))
        data = _json_object(_content(answer))
        return self._build(capture, data)

    def _payload(self, capture: CapturedInteraction) -> dict[str, Any]:
        interaction = capture.interaction
        parts = [f"Turn time: {interaction.occurred_at.isoformat()}"]
        speaker = speaker_of(interaction)
        if not speaker.is_subject:
            # Another person spoke: only what they say to or about the subject counts.
            parts.append(
                f"Speaker: {interaction.actor}, who is NOT the user. The user is "
                f"{speaker.subject_name}. Propose attributes only for what this speaker says "
                'about the user ("you are ...", or the user by name); none about the speaker.'
            )
        parts.append("User's message:\n<<<\n" + interaction.user_input[:MAX_INPUT_CHARS] + "\n>>>")
        if self.include_agent_reply and interaction.agent_response.strip():
            reply = interaction.agent_response[:MAX_INPUT_CHARS]
            parts.append("Agent's reply (context only, not evidence):\n<<<\n" + reply + "\n>>>")
        return {
            "model": self.model,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": "\n\n".join(parts)},
            ],
            "response_format": {"type": "json_object"},
            "temperature": self.temperature,
            "stream": False,
        }

    def _post(self, payload: dict[str, Any]) -> Any:
        url = f"{self.base_url}/chat/completions"
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        try:
            response = self._client.post(url, json=payload, headers=headers, timeout=self.timeout_s)
        except httpx.TimeoutException as exc:
            raise ExtractionError(
                f"model server at {url} did not answer within {self.timeout_s:g}s"
            ) from exc
        except httpx.HTTPError as exc:
            raise ExtractionError(f"could not reach model server at {url}: {exc}") from exc
        if response.status_code >= 400:
            snippet = " ".join(response.text[:200].split())
            raise ExtractionError(
                f"model server at {url} answered HTTP {response.status_code}: {snippet}",
                retryable=response.status_code >= 500 or response.status_code == 429,
            )
        try:
            return response.json()
        except ValueError as exc:
            raise ExtractionError(
                f"model server at {url} answered with something other than JSON"
            ) from exc

    def _build(self, capture: CapturedInteraction, data: dict[str, Any]) -> ProposalBatch:
        """Validate each item on its own; attach the capture as the only evidence."""
        interaction = capture.interaction
        evidence = (capture.capture_id,)
        proposals: list[Proposal] = []
        dropped = 0
        ignored_evidence = _count_evidence_claims(data)

        # Another speaker's words are reported, never the subject's own, and make no plans.
        reported = not speaker_of(interaction).is_subject
        attributes, bad = _items(data, "attributes", _AttributeItem)
        dropped += bad
        for a in attributes:
            proposals.append(
                AttributeProposal(
                    key=a.key,
                    value=a.value,
                    evidence=evidence,
                    confidence=min(a.confidence, REPORTED_CONFIDENCE) if reported else a.confidence,
                    explicit=a.explicit and not reported,
                    supersedes=a.supersedes,
                    negated=a.negated,
                    reported=reported,
                )
            )
        intents, bad = _items(data, "intents", _IntentItem)
        dropped += bad
        if reported:
            dropped += len(intents)
            intents = []
        for i in intents:
            proposals.append(
                IntentProposal(
                    description=i.description,
                    evidence=evidence,
                    category=i.category,
                    confidence=i.confidence,
                    expires_at=_future_or_none(i.expires_at, interaction.occurred_at),
                )
            )
        updates, bad = _items(data, "intent_updates", _UpdateItem)
        dropped += bad
        if reported:
            dropped += len(updates)
            updates = []
        for u in updates:
            proposals.append(
                IntentUpdateProposal(status=u.status, description=u.description, evidence=evidence)
            )
        memory, bad = _memory_item(data.get("memory"))
        dropped += bad
        if memory is not None:
            proposals.append(
                MemoryProposal(
                    text=truncate(memory.text, self.memory_max_chars),
                    evidence=evidence,
                    category="conversation",
                    importance=memory.importance,
                    source_refs=(interaction.source_ref,) if interaction.source_ref else (),
                    occurred_at=interaction.occurred_at,
                )
            )
        return self._batch(
            capture, tuple(proposals), dropped=dropped, ignored_evidence=ignored_evidence
        )

    def _batch(
        self,
        capture: CapturedInteraction,
        proposals: tuple[Proposal, ...],
        *,
        dropped: int,
        ignored_evidence: int,
    ) -> ProposalBatch:
        interaction = capture.interaction
        extras = {"dropped": str(dropped), "model": self.model}
        if ignored_evidence:
            extras["ignored_evidence"] = str(ignored_evidence)
        return ProposalBatch(
            proposals=proposals,
            author=self.author,
            owner_agent=interaction.agent_id,
            sharing=interaction.sharing,
            app_id=interaction.app_id,
            purpose=interaction.purpose,
            extras=extras,
        )


# --- Parsing helpers ----------------------------------------------------------------------


def _content(answer: Any) -> str:
    """The assistant message text of a chat-completions answer."""
    try:
        envelope = _Envelope.model_validate(answer)
    except ValidationError as exc:
        raise ExtractionError("model server answer has no choices[0].message") from exc
    content = envelope.choices[0].message.content
    if not content or not content.strip():
        raise ExtractionError("model answered with an empty message")
    return content


def _json_object(content: str) -> dict[str, Any]:
    """Parse the model's JSON object, tolerating code fences and chatter around it."""
    text = _FENCE_RE.sub("", content).strip()
    for candidate in (text, text[text.find("{") : text.rfind("}") + 1]):
        if not candidate:
            continue
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    raise ExtractionError(
        f"model did not answer with a JSON object: {' '.join(content[:120].split())!r}"
    )


_T = TypeVar("_T", bound="_Item")


def _items(data: dict[str, Any], field: str, model: type[_T]) -> tuple[list[_T], int]:
    """Validate data[field] item by item: (valid items, number dropped)."""
    raw = data.get(field, [])
    if raw is None:
        return [], 0
    if not isinstance(raw, list):
        return [], 1
    good: list[_T] = []
    dropped = 0
    for item in raw:
        try:
            good.append(model.model_validate(item))
        except ValidationError:
            dropped += 1
    return good, dropped


def _memory_item(raw: Any) -> tuple[_MemoryItem | None, int]:
    if raw is None:
        return None, 0
    if isinstance(raw, str):  # a bare string is an acceptable shorthand for {"text": ...}
        raw = {"text": raw}
    try:
        return _MemoryItem.model_validate(raw), 0
    except ValidationError:
        return None, 1


def _count_evidence_claims(data: dict[str, Any]) -> int:
    """How many items carried their own evidence or ids, which are ignored."""
    count = 0
    for field in ("attributes", "intents", "intent_updates"):
        items = data.get(field)
        if isinstance(items, list):
            count += sum(1 for i in items if isinstance(i, dict) and _EVIDENCE_KEYS & i.keys())
    memory = data.get("memory")
    if isinstance(memory, dict) and _EVIDENCE_KEYS & memory.keys():
        count += 1
    return count


def _future_or_none(expires_at: datetime | None, occurred_at: datetime) -> datetime | None:
    """A deadline the model computed, in the turn's time zone, kept only if in the future."""
    if expires_at is None:
        return None
    if expires_at.tzinfo is None:
        expires_at = expires_at.replace(tzinfo=occurred_at.tzinfo)
    try:
        return expires_at if expires_at > occurred_at else None
    except TypeError:  # aware against naive: the turn time carries no zone
        return None
