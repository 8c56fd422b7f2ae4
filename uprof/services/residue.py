"""Residue audit: prove that nothing readable of erased subjects is left.

It plants nothing. Two checks, over every store the system writes:

* **plaintext**: search terms the auditor supplies (a name, an e-mail, a phrase the
  user said) are looked for as UTF-8 and UTF-16 bytes in every file under the
  data folder — SQLite databases with their ``-wal``/``-shm``/``-journal``
  siblings, exports, logs — and in every column of every table of a PostgreSQL
  database;
* **decryptable data**: for every stream the key store lists as shredded, no key
  of any kind remains, no snapshot remains, no read-model row remains, and every
  stored event either is a tombstone (ids only) or fails to open.

A finding names the exact location (file and byte offset, or table, column and
row), so an auditor can look for themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from uuid import UUID

import sqlalchemy as sa

from domain.profile import SubjectProfile
from projections.profile import tables as t
from uprof.crypto.mapper import TOMBSTONE_TOPICS
from uprof.crypto.tables import capture_keys, subject_aliases, subject_index, subject_keys
from uprof.eventstore import ProfilesApplication

#: Files are read in chunks; a term split across a chunk border is still found.
CHUNK = 1 << 20


@dataclass(frozen=True)
class Finding:
    kind: str  # "plaintext" | "decryptable" | "key" | "row" | "snapshot"
    location: str
    detail: str


@dataclass
class ResidueReport:
    findings: list[Finding] = field(default_factory=list)
    files_scanned: int = 0
    bytes_scanned: int = 0
    tables_scanned: int = 0
    streams_checked: int = 0
    events_checked: int = 0

    @property
    def clean(self) -> bool:
        return not self.findings


def _encodings(term: str) -> list[bytes]:
    variants = {term, term.lower(), term.upper()}
    out: list[bytes] = []
    for v in sorted(variants):
        out += [v.encode("utf-8"), v.encode("utf-16-le")]
    return [b for b in out if b]


def scan_files(root: Path, terms: Sequence[str], report: ResidueReport) -> None:
    """Look for each term's bytes in every regular file under root."""
    needles = [(term, needle) for term in terms for needle in _encodings(term)]
    if not needles:
        return
    overlap = max(len(n) for _, n in needles)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        report.files_scanned += 1
        with path.open("rb") as fh:
            offset = 0
            tail = b""
            while chunk := fh.read(CHUNK):
                window = tail + chunk
                base = offset - len(tail)
                for term, needle in needles:
                    at = window.find(needle)
                    if at >= 0:
                        report.findings.append(
                            Finding("plaintext", f"{path}@{base + at}", f"term {term!r}")
                        )
                offset += len(chunk)
                report.bytes_scanned += len(chunk)
                tail = window[-overlap:]
    _dedupe(report)


def scan_postgres(engine: sa.Engine, terms: Sequence[str], report: ResidueReport) -> None:
    """Look for each term in every column of every table of the database."""
    if engine.dialect.name != "postgresql" or not terms:
        return
    inspector = sa.inspect(engine)
    with engine.connect() as conn:
        for table_name in inspector.get_table_names():
            report.tables_scanned += 1
            for column in inspector.get_columns(table_name):
                name = column["name"]
                expr = (
                    f"encode(\"{name}\"::bytea, 'escape')"
                    if _is_bytea(column)
                    else f'"{name}"::text'
                )
                for term in terms:
                    hits = (
                        conn.execute(
                            sa.text(
                                f'SELECT ctid::text FROM "{table_name}" '
                                f"WHERE position(lower(:term) in lower({expr})) > 0 LIMIT 5"
                            ),
                            {"term": term},
                        )
                        .scalars()
                        .all()
                    )
                    for ctid in hits:
                        report.findings.append(
                            Finding(
                                "plaintext", f"{table_name}.{name} row {ctid}", f"term {term!r}"
                            )
                        )


def _is_bytea(column: dict[str, object]) -> bool:
    return "BYTEA" in str(column["type"]).upper() or "LARGEBINARY" in str(column["type"]).upper()


def check_shredded_streams(
    app: ProfilesApplication,
    keys: sa.Engine,
    views: sa.Engine,
    stream_ids: Iterable[str],
    report: ResidueReport,
) -> None:
    """Every erased stream: no key, no alias, no snapshot, no view row, no event that opens."""
    for stream_id in stream_ids:
        report.streams_checked += 1
        with keys.connect() as conn:
            for table in (subject_keys, capture_keys, subject_index, subject_aliases):
                n = conn.execute(
                    sa.select(sa.func.count())
                    .select_from(table)
                    .where(table.c.stream_id == stream_id)
                ).scalar_one()
                if n:
                    report.findings.append(
                        Finding("key", f"{table.name} stream {stream_id}", f"{n} rows remain")
                    )
        with views.connect() as conn:
            for table in t.SUBJECT_TABLES:
                n = conn.execute(
                    sa.select(sa.func.count())
                    .select_from(table)
                    .where(table.c.stream_id == stream_id)
                ).scalar_one()
                if n:
                    report.findings.append(
                        Finding("row", f"{table.name} stream {stream_id}", f"{n} rows remain")
                    )
        if app.snapshots is not None and app.snapshots.recorder.select_events(UUID(stream_id)):
            report.findings.append(
                Finding("snapshot", f"snapshots stream {stream_id}", "snapshot rows remain")
            )
        for stored in app.recorder.select_events(UUID(stream_id)):
            report.events_checked += 1
            if stored.topic in TOMBSTONE_TOPICS:
                continue
            event = app.mapper.to_domain_event(stored)
            if not isinstance(event, SubjectProfile.ContentShredded):
                report.findings.append(
                    Finding(
                        "decryptable",
                        f"event {stream_id}@{stored.originator_version}",
                        f"{stored.topic} still opens",
                    )
                )


def _dedupe(report: ResidueReport) -> None:
    seen: set[tuple[str, str, str]] = set()
    unique = []
    for f in report.findings:
        key = (f.kind, f.location, f.detail)
        if key not in seen:
            seen.add(key)
            unique.append(f)
    report.findings = unique
