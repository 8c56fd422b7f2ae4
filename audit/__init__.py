"""Tamper-evident audit log of uprof: RFC 9162 Merkle log, C2SP signed checkpoints,
RFC 8785 canonical entries, exports with inclusion proofs, consistency proof documents,
offline verifiers, erasure receipts.

Imports only ``domain`` and the standard library, SQLAlchemy, cryptography and rfc8785.
The format is documented in docs/audit-format.md.
"""

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
