"""AuditTrail adapter over the Merkle audit log."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from domain.principal import acting_principal
from uprof.ports import AuditStore


class AuditLogTrail:
    """Append one allowlisted, pseudonymous entry per call, naming the asking principal.

    The principal comes from the facade's context (``acting_principal``); writes the
    pipeline makes on its own (extraction, projection) carry none, and the read
    recorder, which runs on its own thread, passes the reader's label explicitly.
    """

    def __init__(self, log: AuditStore, tenant: str) -> None:
        self.log = log
        self._tenant = tenant

    def record(self, action: str, **fields: Any) -> None:
        self.log.append(self._entry(action, fields))

    def record_many(
        self,
        entries: Sequence[tuple[str, dict[str, Any]]],
        *,
        once_by: Sequence[str | tuple[str, ...]] = (),
        admitted: Callable[[], None] | None = None,
    ) -> None:
        self.log.append_many(
            [self._entry(action, fields) for action, fields in entries],
            once_by=once_by,
            admitted=admitted,
        )

    def _entry(self, action: str, fields: dict[str, Any]) -> dict[str, Any]:
        entry = {"action": action, "tenant": self._tenant}
        principal = acting_principal.get()
        if principal is not None:
            entry["principal"] = principal.label
        entry.update({k: v for k, v in fields.items() if v is not None})
        return entry
