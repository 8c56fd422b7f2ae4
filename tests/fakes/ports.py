"""Fakes of the clock, the audit trail and a tiny extractor."""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from audit.log import once_keys
from domain.values import (
    AttributeProposal,
    CapturedInteraction,
    IntentProposal,
    MemoryProposal,
    ProposalBatch,
)


@dataclass
class FakeClock:
    """A clock that moves only when told to."""

    current: datetime = field(default_factory=lambda: datetime(2026, 1, 1, 12, tzinfo=UTC))

    def now(self) -> datetime:
        return self.current

    def advance(self, **kwargs: float) -> datetime:
        self.current += timedelta(**kwargs)
        return self.current


@dataclass
class InMemoryAuditTrail:
    entries: list[dict[str, Any]] = field(default_factory=list)

    def record(self, action: str, **fields: Any) -> None:
        self.entries.append({"action": action, **fields})

    def record_many(
        self,
        entries: list[tuple[str, dict[str, Any]]],
        *,
        once_by: Sequence[str | tuple[str, ...]] = (),
        admitted: Callable[[], None] | None = None,
    ) -> None:
        if admitted is not None:
            admitted()
        for action, fields in entries:
            keys = once_keys({"action": action, **fields}, once_by)
            held = {key for e in self.entries for key in once_keys(e, once_by)}
            if not once_by or not all(key in held for key in keys):
                self.record(action, **fields)

    def actions(self) -> list[str]:
        return [e["action"] for e in self.entries]


_LIVE_IN = re.compile(r"\bI live in ([A-Z][a-zA-Z]+)")
_WANT = re.compile(r"\bI want to ([a-z ]+)")


class FakeExtractor:
    """Deterministic stand-in: one memory per capture, 'I live in X', 'I want to Y'."""

    name = "fake"

    def extract(self, capture: CapturedInteraction) -> ProposalBatch:
        i = capture.interaction
        evidence = (capture.capture_id,)
        proposals: list[Any] = [
            MemoryProposal(
                text=i.user_input,
                evidence=evidence,
                source_refs=(i.source_ref,) if i.source_ref else (),
                occurred_at=i.occurred_at,
            )
        ]
        if m := _LIVE_IN.search(i.user_input):
            proposals.append(AttributeProposal("home_location", m.group(1), evidence, 0.9))
        if m := _WANT.search(i.user_input):
            proposals.append(IntentProposal(m.group(1).strip(), evidence))
        return ProposalBatch(
            tuple(proposals),
            author="fake",
            owner_agent=i.agent_id,
            sharing=i.sharing,
            app_id=i.app_id,
            purpose=i.purpose,
        )


class InMemoryKeyMaterialStore:
    """KeyMaterialStore in memory: what a secrets-manager implementation would look like."""

    def __init__(self) -> None:

        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        self.location = "memory"
        self._master: bytes | None = None
        self._ring: dict[int, bytes] | None = None
        self._signing = Ed25519PrivateKey.generate()
        self._records: list[Any] = []
        self._ring_lock = threading.RLock()
        self._upgrades: set[str] = set()
        self._in_flight: set[str] = set()

    def master_secret(self) -> bytes:
        import secrets

        if self._master is None:
            self._master = secrets.token_bytes(32)
        return self._master

    def has_master_secret(self) -> bool:
        return self._master is not None

    def load_kek_ring(self) -> dict[int, bytes]:
        import secrets

        if self._ring is None:
            self._ring = {1: secrets.token_bytes(32)}
        return dict(self._ring)

    def save_kek_ring(self, keys: dict[int, bytes]) -> None:
        self._ring = dict(keys)

    def ring_lock(self, *, exclusive: bool) -> Any:
        return self._ring_lock  # one process: one lock, shared or not

    def audit_signing_key(self) -> Any:
        return self._signing

    def audit_keys(self) -> Any:
        from audit.keyring import StaticSigningKeys

        return StaticSigningKeys(self._signing)

    def append_erasure(self, record: Any) -> None:
        self._records.append(record)

    def data_upgraded(self, name: str) -> bool:
        return name in self._upgrades

    def record_data_upgrade(self, name: str) -> None:
        self._upgrades.add(name)

    def forget_data_upgrade(self, name: str) -> None:
        self._upgrades.discard(name)

    def erasure_records(self) -> tuple[Any, ...]:
        return tuple(self._records)

    @contextlib.contextmanager
    def erasure_in_flight(self, request_id: str) -> Iterator[None]:
        self._in_flight.add(request_id)  # one process: it is alive while this runs
        try:
            yield
        finally:
            self._in_flight.discard(request_id)

    @contextlib.contextmanager
    def erasure_finishing(self, request_id: str) -> Iterator[bool]:
        if request_id in self._in_flight:
            yield False  # its (live) holder finishes it
            return
        with self.erasure_in_flight(request_id):
            yield True

    def erasure_mark_state(self, request_id: str) -> str:
        return "held" if request_id in self._in_flight else "none"

    @contextlib.contextmanager
    def erasure_owner_gone(self, request_id: str) -> Iterator[bool]:
        yield False  # one process: a request it began is alive or finished

    def settled_mark(self) -> str | None:
        return getattr(self, "_settled_mark", None)

    def write_settled_mark(self, text: str) -> None:
        self._settled_mark = text

    @contextlib.contextmanager
    def settle_host_turn(self) -> Iterator[None]:
        yield  # one process: no other run to wait for

    @contextlib.contextmanager
    def erasure_mark_of_host(
        self, request_id: str, host: str, *, keep: bool = False
    ) -> Iterator[str]:
        yield "none"  # one process, one host: no other host's marks
