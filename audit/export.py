"""Export a filtered audit trail with inclusion proofs, as JSONL or CSV.

The format is described in ``audit.export_format`` and docs/audit-format.md. Each export first
signs and stores a fresh checkpoint, then writes every matching entry below that tree size with
its inclusion proof against it, then a signed trailer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from datetime import datetime
from hashlib import sha256
from pathlib import Path
from typing import TextIO

from audit._codec import b64encode
from audit.canonical import canonical_bytes
from audit.entry import normalise_timestamp
from audit.export_format import (
    CSV_COLUMNS,
    CSV_COPIED_FIELDS,
    CSV_PROOF_SEPARATOR,
    EXPORT_FORMAT,
    check_filter,
    csv_line,
    entry_line,
)
from audit.keys import key_id, note_key_id
from audit.log import AuditLog, StoredEntry, TenantScope

_PROOF_BATCH = 500


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote."""

    tree_size: int
    entry_count: int
    checkpoint: str
    export_sha256: str


@dataclass(frozen=True)
class _Row:
    kind: str
    line: str  # canonical JSONL line, without newline
    stored: StoredEntry | None = None
    proof_b64: tuple[str, ...] = ()
    summary: ExportSummary | None = None  # on the trailer


def _filter(
    subject_ref: str | None,
    app_id: str | None,
    action: str | None,
    since: str | datetime | None,
    until: str | datetime | None,
) -> dict[str, str]:
    chosen: dict[str, str] = {}
    for name, value in (("subject_ref", subject_ref), ("app_id", app_id), ("action", action)):
        if value is not None:
            chosen[name] = value
    if since is not None:
        chosen["since"] = normalise_timestamp(since, "since")
    if until is not None:
        chosen["until"] = normalise_timestamp(until, "until")
    check_filter(chosen)  # what the verifier will read in the header (bug NB)
    return chosen


def _rows(
    log: AuditLog, chosen: dict[str, str], tenant: str | None = None
) -> Generator[_Row, None, None]:
    """Yield the header, the entry rows and the trailer (which carries the summary).

    With ``tenant``, only what that tenant's readers see (``AuditLog.tenant_scope``): when
    every entry up to the checkpoint is theirs (the stores hold one tenant) the export is
    what it would be without; otherwise it is filtered on ``tenant``, a filter the
    verifier checks entry by entry, and entries naming no tenant are left out."""
    # One key for the header's ids and the trailer's signature, whatever another process
    # rotates meanwhile (the checkpoint is checked against the whole endorsed history).
    key = log.signing_key()
    checkpoint = log.checkpoint_record(key=key)
    scope: TenantScope | None = None
    if tenant is not None:
        scope = log.tenant_scope(tenant)
        if scope.untagged_below >= checkpoint.tree_size:
            scope = None  # every entry of this tree is the tenant's
        else:
            chosen = {**chosen, "tenant": tenant}
            scope = TenantScope(tenant, 0)
    header = {
        "checkpoint": checkpoint.note,
        "exported_at": log.now(),
        "filter": chosen,
        "filtered": bool(chosen),
        "format": EXPORT_FORMAT,
        "key_id": key_id(key),
        "kind": "header",
        "note_key_id": note_key_id(log.origin, key).hex(),
        "origin": log.origin,
        "tree_size": checkpoint.tree_size,
    }
    digest = sha256()
    header_line = canonical_bytes(header).decode("utf-8")
    digest.update(header_line.encode("utf-8") + b"\n")
    yield _Row("header", header_line)

    count = 0
    stream = log.entries(
        subject_ref=chosen.get("subject_ref"),
        app_id=chosen.get("app_id"),
        action=chosen.get("action"),
        since=chosen.get("since"),
        until=chosen.get("until"),
        tree_size=checkpoint.tree_size,
        scope=scope,
    )
    while True:
        batch = [entry for _, entry in zip(range(_PROOF_BATCH), stream, strict=False)]
        if not batch:
            break
        proofs = log.inclusion_proofs([e.leaf_index for e in batch], checkpoint.tree_size)
        for stored, proof in zip(batch, proofs, strict=True):
            proof_b64 = tuple(b64encode(h) for h in proof)
            line = entry_line(stored.entry_json, proof_b64, stored.leaf_index)
            digest.update(line.encode("utf-8") + b"\n")
            count += 1
            yield _Row("entry", line, stored, proof_b64)

    export_digest = digest.digest()
    trailer = {
        "entry_count": count,
        "export_sha256": export_digest.hex(),
        "kind": "trailer",
        "signature": b64encode(log.sign_export_digest(export_digest, key=key)),
    }
    summary = ExportSummary(checkpoint.tree_size, count, checkpoint.note, export_digest.hex())
    yield _Row("trailer", canonical_bytes(trailer).decode("utf-8"), summary=summary)


def _open_target(dest: str | os.PathLike[str] | TextIO) -> tuple[TextIO, bool]:
    if isinstance(dest, str | os.PathLike):
        return Path(dest).open("w", encoding="utf-8", newline=""), True
    return dest, False


def export_jsonl(
    log: AuditLog,
    dest: str | os.PathLike[str] | TextIO,
    *,
    subject_ref: str | None = None,
    app_id: str | None = None,
    action: str | None = None,
    since: str | datetime | None = None,
    until: str | datetime | None = None,
) -> ExportSummary:
    """Write the trail (optionally filtered; ``since`` inclusive, ``until`` exclusive) as JSONL."""
    return _export(log, dest, _filter(subject_ref, app_id, action, since, until), as_csv=False)


def export_csv(
    log: AuditLog,
    dest: str | os.PathLike[str] | TextIO,
    *,
    subject_ref: str | None = None,
    app_id: str | None = None,
    action: str | None = None,
    since: str | datetime | None = None,
    until: str | datetime | None = None,
) -> ExportSummary:
    """Write the same trail as ``export_jsonl`` in CSV (one record per line)."""
    return _export(log, dest, _filter(subject_ref, app_id, action, since, until), as_csv=True)


class ExportStream:
    """An export as text, one record (line) at a time, for streaming it as it is produced.

    The header (and the checkpoint it signs) is made when the stream is created, so a bad
    filter or an unreadable log fails before the first byte is sent; ``summary`` is set
    once the trailer has been yielded. ``on_close(summary, entries_sent)`` runs once, when
    the stream is exhausted or closed early (a client that went away).
    """

    def __init__(
        self,
        log: AuditLog,
        chosen: dict[str, str],
        *,
        as_csv: bool,
        on_close: Callable[[ExportSummary | None, int], None] | None = None,
        tenant: str | None = None,
    ) -> None:
        self.as_csv = as_csv
        self.media_type = "text/csv" if as_csv else "application/x-ndjson"
        self.filename = "audit-trail.csv" if as_csv else "audit-trail.jsonl"
        self.summary: ExportSummary | None = None
        self._on_close = on_close
        self._sent = 0
        self._closed = False
        self._rows = _rows(log, chosen, tenant)
        first = next(self._rows)  # the header: checkpoint signed and stored now
        #: The tree size every proof in this export is against (from the header).
        self.tree_size: int = json.loads(first.line)["tree_size"]
        lead = csv_line(CSV_COLUMNS) if as_csv else ""
        self._pending: list[str] = [lead + self._text(first)]

    def _text(self, row: _Row) -> str:
        if row.kind == "entry":
            self._sent += 1
        if row.summary is not None:
            self.summary = row.summary
        if self.as_csv:
            return csv_line(csv_record(row.kind, row.line, row.stored, row.proof_b64))
        return row.line + "\n"

    def __iter__(self) -> Iterator[str]:
        try:
            while self._pending:
                yield self._pending.pop()
            for row in self._rows:
                yield self._text(row)
        finally:
            self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._rows.close()
        if self._on_close is not None:
            self._on_close(self.summary, self._sent)


def stream_export(
    log: AuditLog,
    *,
    fmt: str = "jsonl",
    subject_ref: str | None = None,
    app_id: str | None = None,
    action: str | None = None,
    since: str | datetime | None = None,
    until: str | datetime | None = None,
    on_close: Callable[[ExportSummary | None, int], None] | None = None,
    tenant: str | None = None,
) -> ExportStream:
    """The same export as ``export_jsonl``/``export_csv``, as a stream of text records;
    with ``tenant``, only that tenant's entries (``_rows``)."""
    chosen = _filter(subject_ref, app_id, action, since, until)
    return ExportStream(log, chosen, as_csv=fmt == "csv", on_close=on_close, tenant=tenant)


def _export(
    log: AuditLog, dest: str | os.PathLike[str] | TextIO, chosen: dict[str, str], *, as_csv: bool
) -> ExportSummary:
    out, owned = _open_target(dest)
    stream = ExportStream(log, chosen, as_csv=as_csv)
    try:
        for text in stream:
            out.write(text)
    finally:
        if owned:
            out.close()
    if stream.summary is None:  # the trailer always comes last; this guards the generator
        raise RuntimeError("export ended without its trailer")
    return stream.summary


def csv_record(
    kind: str, line: str, stored: StoredEntry | None, proof_b64: tuple[str, ...]
) -> list[str]:
    """Return the CSV cells for one row of the export."""
    if stored is None:
        return [kind, "", "", "", "", "", "", "", line]
    entry = stored.entry
    copies = [str(entry.get(name, "")) for name in CSV_COPIED_FIELDS]
    return [
        kind,
        str(stored.leaf_index),
        *copies,
        stored.entry_json,
        CSV_PROOF_SEPARATOR.join(proof_b64),
        "",
    ]
