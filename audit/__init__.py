"""Tamper-evident audit log of uprof: RFC 9162 Merkle log, C2SP signed checkpoints,
RFC 8785 canonical entries, exports with inclusion proofs, consistency proof documents,
offline verifiers, erasure receipts.

Imports only ``domain`` and the standard library, SQLAlchemy, cryptography and rfc8785.
The format is documented in docs/audit-format.md.

The names below load with the first use of each (PEP 562): importing one module of the
package, ``audit.lockfile`` by the settings of every CLI command, ran this file and so
the whole package, SQLAlchemy with it (~0.4 s of every ``uprof --help``; 0249-cli-start-cost).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from audit.canonical import canonical_bytes
    from audit.checkpoint import CheckpointBody, sign_checkpoint, verify_checkpoint
    from audit.entry import ENTRY_FIELDS, validate_entry
    from audit.errors import AuditEntryError, AuditKeyError, VerificationError
    from audit.export import ExportSummary, export_csv, export_jsonl
    from audit.keyring import (
        FileKeyRing,
        KeyHistory,
        parse_key_history,
        trusted_keys,
        verify_key_history,
    )
    from audit.keys import (
        key_id,
        load_or_create_signing_key,
        load_public_key,
        note_key_id,
        public_key_pem,
    )
    from audit.log import AuditLog, AuditRecord, StoredCheckpoint, StoredEntry, TenantScope
    from audit.proofs import ProofReport, build_proof, parse_proof, proof_bytes, verify_proof
    from audit.receipts import (
        issue_erasure_receipt,
        new_commitment_nonce,
        subject_commitment,
        verify_receipt,
        verify_subject_commitment,
    )
    from audit.tables import AuditBackend, create_tables, metadata
    from audit.verify import VerificationReport, verify_export

#: Each name of the package and the module that defines it.
_WHERE = {
    "AuditBackend": "audit.tables",
    "AuditEntryError": "audit.errors",
    "AuditKeyError": "audit.errors",
    "AuditLog": "audit.log",
    "AuditRecord": "audit.log",
    "CheckpointBody": "audit.checkpoint",
    "ENTRY_FIELDS": "audit.entry",
    "ExportSummary": "audit.export",
    "FileKeyRing": "audit.keyring",
    "KeyHistory": "audit.keyring",
    "ProofReport": "audit.proofs",
    "StoredCheckpoint": "audit.log",
    "StoredEntry": "audit.log",
    "TenantScope": "audit.log",
    "VerificationError": "audit.errors",
    "VerificationReport": "audit.verify",
    "build_proof": "audit.proofs",
    "canonical_bytes": "audit.canonical",
    "create_tables": "audit.tables",
    "export_csv": "audit.export",
    "export_jsonl": "audit.export",
    "issue_erasure_receipt": "audit.receipts",
    "key_id": "audit.keys",
    "load_or_create_signing_key": "audit.keys",
    "load_public_key": "audit.keys",
    "metadata": "audit.tables",
    "new_commitment_nonce": "audit.receipts",
    "note_key_id": "audit.keys",
    "parse_key_history": "audit.keyring",
    "parse_proof": "audit.proofs",
    "proof_bytes": "audit.proofs",
    "public_key_pem": "audit.keys",
    "sign_checkpoint": "audit.checkpoint",
    "subject_commitment": "audit.receipts",
    "trusted_keys": "audit.keyring",
    "validate_entry": "audit.entry",
    "verify_checkpoint": "audit.checkpoint",
    "verify_export": "audit.verify",
    "verify_key_history": "audit.keyring",
    "verify_proof": "audit.proofs",
    "verify_receipt": "audit.receipts",
    "verify_subject_commitment": "audit.receipts",
}

__all__ = [
    "ENTRY_FIELDS",
    "AuditBackend",
    "AuditEntryError",
    "AuditKeyError",
    "AuditLog",
    "AuditRecord",
    "CheckpointBody",
    "ExportSummary",
    "FileKeyRing",
    "KeyHistory",
    "ProofReport",
    "StoredCheckpoint",
    "StoredEntry",
    "TenantScope",
    "VerificationError",
    "VerificationReport",
    "build_proof",
    "canonical_bytes",
    "create_tables",
    "export_csv",
    "export_jsonl",
    "issue_erasure_receipt",
    "key_id",
    "load_or_create_signing_key",
    "load_public_key",
    "metadata",
    "new_commitment_nonce",
    "note_key_id",
    "parse_key_history",
    "parse_proof",
    "proof_bytes",
    "public_key_pem",
    "sign_checkpoint",
    "subject_commitment",
    "trusted_keys",
    "validate_entry",
    "verify_checkpoint",
    "verify_export",
    "verify_key_history",
    "verify_proof",
    "verify_receipt",
    "verify_subject_commitment",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
