"""Wire model of one interaction to capture."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field

from domain.values import Interaction, check_sharing


class InteractionIn(BaseModel):
    """One interaction as an app sends it (a JSONL line, or a REST body)."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)

    subject: str = Field(min_length=1, max_length=256)
    app_id: str = Field(min_length=1, max_length=128)
    agent_id: str = Field(min_length=1, max_length=128)
    agent_type: str = Field(default="", max_length=64)
    user_input: str = Field(default="", max_length=32_000)
    agent_response: str = Field(default="", max_length=32_000)
    occurred_at: AwareDatetime
    session_id: str = Field(default="", max_length=128)
    actor: str = Field(default="", max_length=128)
    source_ref: str = Field(default="", max_length=256)
    purpose: str = Field(default="personalization", min_length=1, max_length=64)
    sharing: Annotated[str, Field(max_length=256), AfterValidator(check_sharing)] = "private"
    context: dict[str, str] = Field(default_factory=dict, max_length=64)
    #: Import records: a retry key of the record's app (a record whose key, or whose
    #: app and source_ref, was captured already is skipped).
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=255)

    def to_domain(self) -> Interaction:
        return Interaction(
            app_id=self.app_id,
            agent_id=self.agent_id,
            agent_type=self.agent_type,
            occurred_at=self.occurred_at,
            user_input=self.user_input,
            agent_response=self.agent_response,
            session_id=self.session_id,
            actor=self.actor,
            source_ref=self.source_ref,
            purpose=self.purpose,
            sharing=self.sharing,
            context=tuple(sorted(self.context.items())),
        )
