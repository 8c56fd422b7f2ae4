"""AuditTrail adapter over the Merkle audit log."""

from __future__ import annotations

from typing import Any

from audit.log import AuditLog


class AuditLogTrail:
    """Append one allowlisted, pseudonymous entry per call."""

    def __init__(self, log: AuditLog, tenant: str) -> None:
        self.log = log
        self._tenant = tenant

    def record(self, action: str, **fields: Any) -> None:
        entry = {"action": action, "tenant": self._tenant}
        entry.update({k: v for k, v in fields.items() if v is not None})
        self.log.append(entry)
