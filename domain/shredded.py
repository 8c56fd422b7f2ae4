"""The placeholder an event of an erased subject reads as."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID


@dataclass(frozen=True)
class Shredded:
    """Position only, no content: the data key that sealed this event is gone."""

    originator_id: UUID
    originator_version: int
    topic: str
