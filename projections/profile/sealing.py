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


def context(table: str, column: str, row_id: str) -> str:
    """Associated data binding a ciphertext to its table, column and row."""
    return f"{table}.{column}|{row_id}"
