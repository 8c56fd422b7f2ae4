"""Wire models of the quarantine routes (``/v1/quarantine``), for operator keys only.

A quarantined capture is shown by its ids, the subject's audit pseudonym, the stage that
failed and the error's class: never its content, its subject reference or an error
message (an extractor's message may quote the capture).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from uprof.schemas.api import ErrorOut


class QuarantinedOut(BaseModel):
    capture_id: str = Field(
        description="The capture's id; `event:<notification id>` for a damaged event "
        "(its capture id is inside the damaged ciphertext)."
    )
    subject_pseudonym: str = Field(description="The subject's audit pseudonym.")
    stage: str = Field(
        description="`extract` (the extractor raised), `apply`, `damaged` (the stored "
        "event does not open) or `load` (its subject's stream holds a damaged event)."
    )
    error: str = Field(description="The error's class (never its message).")
    attempts: int
    quarantined_at: datetime
    notification_id: int


class QuarantineOut(BaseModel):
    captures: list[QuarantinedOut]


class QuarantineRetryIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"capture_ids": None}]}
    )

    capture_ids: list[str] | None = Field(
        default=None,
        max_length=1000,
        description="The captures to extract again; null retries every quarantined one.",
    )


class RetryOutcomeOut(BaseModel):
    capture_id: str
    outcome: str = Field(
        description="`released`, `still-failing`, `not-quarantined` or `not-retryable` "
        "(a damaged event that opens again after a repair by hand: restore the stores)."
    )
    error: str = Field(default="", description="The error's class, when still failing.")


class QuarantineRetryOut(BaseModel):
    outcomes: list[RetryOutcomeOut]


class QuarantineRetryRefusedOut(ErrorOut):
    """A retry refused partway (the key revoked while a capture was extracted, an
    outage): the refusal, and what was done before it."""

    outcomes: list[RetryOutcomeOut] = Field(
        default_factory=list,
        description="The captures retried before the refusal, as a 200 lists them (those "
        "`released` are released, each audited `capture.released`); the others named "
        "were not released.",
    )
