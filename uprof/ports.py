"""Ports: the capabilities the services need from the world, as Protocols.

Adapters in ``uprof/adapters`` and in the sibling packages satisfy them
structurally; every port has a fake in ``tests/fakes``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

import numpy as np

from domain.values import CapturedInteraction, ProposalBatch


class Clock(Protocol):
    def now(self) -> datetime:
        """Return the current time, timezone-aware UTC."""
        ...


class TokenCounter(Protocol):
    def count(self, text: str) -> int:
        """Return the number of cl100k tokens in text."""
        ...


class Embedder(Protocol):
    dimension: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return an (n, dimension) float32 matrix of L2-normalised rows."""
        ...


class Extractor(Protocol):
    name: str

    def extract(self, capture: CapturedInteraction) -> ProposalBatch:
        """Propose attributes, memories and intents, each citing the capture as evidence."""
        ...


class AuditTrail(Protocol):
    def record(self, action: str, **fields: object) -> None:
        """Append one entry (no personal plaintext: pseudonyms, ids, counts only)."""
        ...

    def record_many(self, entries: Sequence[tuple[str, dict[str, object]]]) -> None:
        """Append (action, fields) entries in order, all or nothing."""
        ...
