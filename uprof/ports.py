"""Ports: the capabilities the services need from the world, as Protocols.

Adapters in ``uprof/adapters`` and in the sibling packages satisfy them
structurally; every port has a fake in ``tests/fakes``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

import numpy as np

from domain.values import CapturedInteraction, ProposalBatch

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


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


@dataclass(frozen=True)
class ErasureRecord:
    """One line of the erasure ledger: what was erased, by ids and keyed hashes only.

    ``kind``: ``subject`` (a whole subject: its stream, and ``mark``, a keyed hash of
    the subject reference, so that the name is refused until re-created), ``captures``
    (captured events of one stream), or ``recreated`` (an operator lifted ``mark``).
    """

    kind: str
    tenant: str
    at: str
    stream_id: str | None = None
    mark: str | None = None
    capture_ids: tuple[str, ...] = ()
    request_id: str = ""


class KeyMaterialStore(Protocol):
    """Where the secrets that open the data live, apart from the data (decision 0012).

    The file implementation (``uprof.crypto.keydir.FileKeyMaterialStore``) is the
    default; a secrets manager or KMS is another class with these methods, and no
    caller changes. Everything here is needed to read the data, so none of it may
    sit beside the data or in a data backup.
    """

    #: Where the material is, for log lines and errors (never the material itself).
    location: str

    def master_secret(self) -> bytes:
        """Return the root secret (at least 32 bytes), creating it on first use."""
        ...

    def has_master_secret(self) -> bool:
        """Whether the root secret exists already (``master_secret`` would not create it)."""
        ...

    def load_kek_ring(self) -> dict[int, bytes]:
        """Return the key-encryption keys by epoch, creating epoch 1 on first use.

        Two processes starting together must end up with the same ring.
        """
        ...

    def save_kek_ring(self, keys: dict[int, bytes]) -> None:
        """Replace the ring atomically and durably (rotation adds and forgets epochs)."""
        ...

    def audit_signing_key(self) -> Ed25519PrivateKey:
        """Return the audit log's Ed25519 signing key, creating it on first use."""
        ...

    def append_erasure(self, record: ErasureRecord) -> None:
        """Append one record durably before returning (an erasure relies on it)."""
        ...

    def erasure_records(self) -> Sequence[ErasureRecord]:
        """Every record appended so far by any process, in order."""
        ...
