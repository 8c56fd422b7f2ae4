"""Errors raised by the audit package.

UprofError (domain.errors)
├── InvalidInputError
│   └── AuditEntryError      an entry the log refuses to store; nothing was written
├── AuditKeyError            the signing key file is missing, malformed or readable by others
└── VerificationError        a proof, signature, checkpoint, export or receipt did not verify
"""

from __future__ import annotations

from domain.errors import InvalidInputError, UprofError


class AuditEntryError(InvalidInputError):
    """An audit entry was refused: unknown key, bad value type, float, or out-of-range integer."""

    hint = (
        "audit entries hold only allowlisted, non-personal fields with string, integer, boolean, "
        "list or object values (see docs/audit-format.md); nothing was stored"
    )


class AuditKeyError(UprofError):
    """The log's signing key could not be loaded or created safely."""

    hint = "check the key file path; it must be a PEM Ed25519 private key with mode 0600"


class VerificationError(UprofError):
    """Something did not verify; the message names what failed and where.

    ``line_number`` (1-based, in an export) and ``leaf_index`` are set when the
    failure belongs to one entry, so a reviewer can go straight to it.
    """

    hint = (
        "treat the artefact as tampered or corrupted; fetch it again from the operator and "
        "check that you pinned the right public key and origin"
    )

    def __init__(
        self,
        message: str,
        *,
        line_number: int | None = None,
        leaf_index: int | None = None,
    ) -> None:
        where = []
        if line_number is not None:
            where.append(f"line {line_number}")
        if leaf_index is not None:
            where.append(f"leaf_index {leaf_index}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)
        self.reason = message
        self.line_number = line_number
        self.leaf_index = leaf_index
