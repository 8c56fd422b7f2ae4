"""The sealing port of the read model: personal fields are stored only as ciphertext."""

from __future__ import annotations

from typing import Protocol


class FieldSealer(Protocol):
    def seal(self, stream_id: str, context: str, data: bytes) -> bytes:
        """Encrypt one field of one row (raises SubjectErasedError if the key is gone)."""
        ...

    def open(self, stream_id: str, context: str, data: bytes) -> bytes | None:
        """Decrypt one field; None when the subject's key no longer exists."""
        ...

    def lookup(self, stream_id: str, context: str, value: str) -> str:
        """A keyed hash of an identifier, for equality lookups within one subject
        (session ids, source refs); under the subject's key, so it cannot be checked
        against a guess once the key is destroyed (raises SubjectErasedError then)."""
        ...


def context(table: str, column: str, row_id: str) -> str:
    """Associated data binding a ciphertext to its table, column and row."""
    return f"{table}.{column}|{row_id}"


def source_ref_scope(app_id: str, source_ref: str) -> str:
    """What a source ref's keyed hash covers: refs are the app's own, so (app, ref)."""
    return f"{app_id}\x1f{source_ref}" if source_ref else ""
