"""The header and trailer lines of an export of no entries, as the exporter writes them
(canonical JSON, every field): what the SDK's summary readers read of an answer since
they read its frame as the verifier does (bug OF). A test that fakes a server's answer
builds it from these."""

from __future__ import annotations

import base64

from audit.canonical import canonical_bytes
from audit.export_format import EXPORT_FORMAT


def header_line(checkpoint: str = "c", tree_size: int = 1) -> str:
    """The header (without its newline)."""
    return canonical_bytes(
        {
            "checkpoint": checkpoint,
            "exported_at": "2026-12-06T00:00:00.000000Z",
            "filter": {},
            "filtered": False,
            "format": EXPORT_FORMAT,
            "key_id": "k",
            "kind": "header",
            "note_key_id": "n",
            "origin": "o",
            "tree_size": tree_size,
        }
    ).decode("utf-8")


def trailer_line(entry_count: int = 0) -> str:
    """The trailer (without its newline) of ``entry_count`` entries."""
    return canonical_bytes(
        {
            "entry_count": entry_count,
            "export_sha256": "00" * 32,
            "kind": "trailer",
            "signature": base64.b64encode(bytes(64)).decode(),
        }
    ).decode("utf-8")
