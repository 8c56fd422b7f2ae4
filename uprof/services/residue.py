"""Residue audit: prove that nothing readable of erased subjects is left.

It plants nothing. Two checks, over every store the system writes:

* **plaintext**: search terms the auditor supplies (a name, an e-mail, a phrase the
  user said) are looked for in any case, Unicode normal form and encoding (UTF-8,
  UTF-16 either way, JSON-escaped, percent-escaped: ``residue_files.needles``) in every
  file under the data folder — SQLite databases with their ``-wal``/``-shm``/``-journal``
  siblings (raw bytes and every table, in one read snapshot, from a child process:
  see ``residue_files``), exports, logs — and in every column of every table and
  materialized view of every schema of a PostgreSQL database;
* **decryptable data**: for every stream the key store lists as shredded, no key
  of any kind remains, no snapshot remains, no read-model row remains, and every
  stored event either is a tombstone (ids only) or fails to open.

A finding names the exact location (file and byte offset, or table, column and
row), so an auditor can look for themselves.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from uuid import UUID

import sqlalchemy as sa

from domain.errors import UprofError
from domain.profile import SubjectProfile
from projections.profile import tables as t
from uprof.backends import backend_for
from uprof.crypto.ledger import ErasureLedger
from uprof.crypto.mapper import PLAIN_TOPICS
from uprof.crypto.tables import (
    capture_keys,
    stream_heads,
    subject_aliases,
    subject_index,
    subject_keys,
)
from uprof.eventstore import ProfilesApplication
from uprof.services import residue_files
from uprof.services.residue_files import needles as _needles
from uprof.storage import fold_log

#: The child that reads the files (standard library only, run with ``python -I``).
_CHILD = Path(residue_files.__file__)


class ResidueScanError(UprofError):
    """The scan could not look everywhere; no verdict is given."""

    hint = "see the error; a residue report is only given for a complete scan"


#: A finding's ``erasure`` when the stream's erasure was running during the scan (its
#: process held its mark, or it finished before the scan ended): what it names is being
#: deleted, and a scan after it ends will not show it.
IN_PROGRESS = "erasure in progress"
#: A finding's ``erasure`` when the stream's erasure began and no process runs it: it
#: stays until someone finishes it (``INTERRUPTED_HINT``).
INTERRUPTED = "erasure interrupted"
#: Another host's erasure: its lock may not reach this host, so neither can be told.
ELSEWHERE = "erasure unfinished on another host"
INTERRUPTED_HINT = (
    "finish it: ask for the same erasure again (uprof erase subject|event|item with the "
    "same subject and target), which completes this request and issues its receipt; "
    "every uprof start also destroys its keys and rows again, but issues no receipt"
)


@dataclass(frozen=True)
class Finding:
    kind: str  # "plaintext" | "decryptable" | "key" | "row" | "snapshot" | "unscanned" |
    # "unfolded" | "erasure" (a request begun and not completed)
    location: str
    detail: str
    #: "" or ``IN_PROGRESS`` / ``INTERRUPTED`` / ``ELSEWHERE``: the state of an erasure of
    #: the stream this finding is of (bug PS: "remain" did not tell them apart).
    erasure: str = ""
    #: The erased stream a finding of ``check_shredded_streams`` is of ("" otherwise).
    stream: str = ""


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


def scan_files(
    root: Path, terms: Sequence[str], report: ResidueReport, *, timeout_s: float | None = None
) -> None:
    """Look for each term's bytes in every regular file under root, from a child process.

    This process opens no file under root: closing a descriptor of a live SQLite file
    would drop the locks its own connections hold (FIELD-NOTES 8.1). The child
    (``residue_files``) reads each database's raw bytes and its tables inside one
    read-only snapshot; see its docstring. A child that fails raises, never passes.
    """
    if not any(_needles(term) for term in terms):
        return
    request = json.dumps({"root": str(root), "terms": list(terms)}).encode("utf-8")
    try:
        done = subprocess.run(  # our own interpreter and file, no shell
            [sys.executable, "-I", str(_CHILD)],
            input=request,
            capture_output=True,
            close_fds=True,  # the child gets none of this process's database descriptors
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise ResidueScanError(f"the file scan did not finish within {timeout_s} s") from e
    if done.returncode != 0:
        last = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
        raise ResidueScanError(f"the file scan failed (exit {done.returncode}): {last[0]}")
    result = json.loads(done.stdout)
    report.files_scanned += result["files_scanned"]
    report.bytes_scanned += result["bytes_scanned"]
    report.tables_scanned += result["tables_scanned"]
    report.findings += [Finding(f["kind"], f["location"], f["detail"]) for f in result["findings"]]
    _dedupe(report)


def scan_database(engine: sa.Engine, terms: Sequence[str], report: ResidueReport) -> None:
    """Look for each term in every column of every table the database server holds.

    The backend reads its tables in place (PostgreSQL); a backend whose databases are
    files in the data folder (SQLite) reports none here, ``scan_files`` reads them.
    """
    if not terms:
        return
    scan = backend_for(engine).scan_tables(engine, terms)
    report.tables_scanned += scan.tables
    report.findings += [
        Finding("plaintext", f"{hit.table}.{hit.column} row {hit.row}", f"term {hit.term!r}")
        for hit in scan.hits
    ]
    report.findings += [
        Finding("unscanned", table, f"cannot read: {why}") for table, why in scan.unreadable
    ]


#: How long the scan tries to fold each store's log before it reports it ``unfolded``
#: (review of 0130, bug GE). Not the erasure's 30 s: an erasure must fold and waits for
#: it; the scan only reports, and with that bound one scan beside a reader of the three
#: stores held its caller (and a server worker thread) for 90 s to say what a few
#: tries already knew. Long enough for the tries to pass the short reads of a busy
#: server (each waits up to ``FOLD_TRY_MS`` for them).
SCAN_FOLD_TIMEOUT_S = 2.0


def check_shredded_streams(
    app: ProfilesApplication,
    keys: sa.Engine,
    views: sa.Engine,
    stream_ids: Iterable[str],
    report: ResidueReport,
) -> None:
    """Every erased stream: no key, no alias, no snapshot, no view row, no event that opens.

    And no store whose write-ahead log cannot be folded (bugs EU, FV): the rows are gone
    for SQL, but until the log is folded the old pages (wrapped keys, view rows) may stay
    in the main file and the log, and the key bytes are no search term. The scan folds
    each store's log itself (SQLite: a truncating checkpoint, as an erasure ends with;
    nothing on PostgreSQL, whose log is the server's) and reports a store it cannot fold
    within ``SCAN_FOLD_TIMEOUT_S`` as ``unfolded``. The ``.fold-owed`` markers are not
    read: they are unauthenticated files (a writer of the data folder deletes or forges
    them), and an erasure a reader kept from folding (``erasure_incomplete``) writes
    none."""
    engines = {id(e): e for e in (keys, views, app.events_engine)}.values()
    for engine in engines:
        if not fold_log(engine, timeout_s=SCAN_FOLD_TIMEOUT_S):
            name = Path(engine.url.database or "").name or str(engine.url)
            report.findings.append(
                Finding(
                    "unfolded",
                    name,
                    "another process holds a read transaction on it: its write-ahead log "
                    "cannot be folded, and until it is the file may still hold erased rows",
                )
            )
    stream_ids = list(stream_ids)
    # Rows left of any erased stream: one query per table for all of them (a chunk of
    # streams at a time), not one per table per stream: the scan checks every stream ever
    # erased, and a deployment's erasures only grow.
    for kind, engine, tables in (
        ("key", keys, (subject_keys, capture_keys, subject_index, subject_aliases, stream_heads)),
        ("row", views, t.SUBJECT_TABLES),
    ):
        with engine.connect() as conn:
            for table in tables:
                for n, stream_id in _rows_left(conn, table, stream_ids):
                    report.findings.append(
                        Finding(
                            kind,
                            f"{table.name} stream {stream_id}",
                            f"{n} rows remain",
                            stream=stream_id,
                        )
                    )
    for stream_id in stream_ids:
        report.streams_checked += 1
        if app.snapshots is not None and app.snapshots.recorder.select_events(UUID(stream_id)):
            report.findings.append(
                Finding(
                    "snapshot",
                    f"snapshots stream {stream_id}",
                    "snapshot rows remain",
                    stream=stream_id,
                )
            )
        for stored in app.recorder.select_events(UUID(stream_id)):
            report.events_checked += 1
            if stored.topic in PLAIN_TOPICS:
                continue
            event = app.mapper.to_domain_event(stored)
            if not isinstance(event, SubjectProfile.ContentShredded):
                report.findings.append(
                    Finding(
                        "decryptable",
                        f"event {stream_id}@{stored.originator_version}",
                        f"{stored.topic} still opens",
                        stream=stream_id,
                    )
                )


@dataclass(frozen=True)
class ErasuresAtStart:
    """The erasure ledger as a scan found it before it read anything (``erasures_at``)."""

    records: int
    open: frozenset[str]


def erasures_at(ledger: ErasureLedger) -> ErasuresAtStart:
    records = ledger.records()
    return ErasuresAtStart(len(records), frozenset(ledger.open_requests(records)))


def label_erasures(ledger: ErasureLedger, start: ErasuresAtStart, report: ResidueReport) -> None:
    """Say, of every erasure begun and not completed, whether it runs (bug PS).

    The scan's findings of a stream whose erasure runs are true when read and gone once it
    ends (it shreds the keys first, deletes the rows after); those of one whose process
    died stay until someone finishes it. The ledger knows which erasures began (a record
    with a receipt's draft) and which completed (``receipted``); the request's in-flight
    mark, whether a live process holds it. Each open request is one ``erasure`` finding,
    so a report is never clean while an erasure is unfinished, and every finding of its
    stream carries its state. An erasure open at the scan's start, or begun during it,
    that completed before its end ran during the scan: its findings are labelled in
    progress (no finding of its own)."""
    records = ledger.records()
    during = {
        r.request_id for r in records[start.records :] if r.kind != "receipted" and r.request_id
    }
    ran = start.open | during
    still = ledger.open_requests(records)
    states: dict[str, str] = {}
    for request_id, record in still.items():
        mark = ledger.mark_state(request_id)
        if mark == "held":
            state = IN_PROGRESS
        elif mark.startswith("host:"):
            state = ELSEWHERE
        elif request_id not in ledger.open_requests():
            state = IN_PROGRESS  # completed between the read above and the look at its mark
        else:
            state = INTERRUPTED
        if state == INTERRUPTED:
            detail = f"{record.kind} erasure begun, no process runs it: {INTERRUPTED_HINT}"
        elif state == ELSEWHERE:
            detail = (
                f"{record.kind} erasure begun on host {mark.removeprefix('host:')}; whether "
                "it runs can be told only there (uprof erase settle-host if that host is gone)"
            )
        else:
            detail = f"{record.kind} erasure running (its process holds its mark)"
        report.findings.append(
            Finding(
                "erasure",
                f"erasure request {request_id} stream {record.stream_id}",
                detail,
                erasure=state,
                stream=record.stream_id or "",
            )
        )
        if record.stream_id:
            # An interrupted request's findings stay: its state wins over a running one's.
            if states.get(record.stream_id) != INTERRUPTED:
                states[record.stream_id] = state
    for record in records:
        if record.request_id in ran and record.request_id not in still and record.stream_id:
            states.setdefault(record.stream_id, IN_PROGRESS)
    report.findings = [
        replace(f, erasure=states[f.stream]) if f.stream in states and not f.erasure else f
        for f in report.findings
    ]


#: Erased streams per ``IN (...)`` list of the rows-left queries.
STREAMS_PER_QUERY = 500


def _rows_left(
    conn: sa.Connection, table: sa.Table, stream_ids: Sequence[str]
) -> Iterator[tuple[int, str]]:
    """(rows, stream) for each of ``stream_ids`` that still has rows in ``table``."""
    for at in range(0, len(stream_ids), STREAMS_PER_QUERY):
        chunk = stream_ids[at : at + STREAMS_PER_QUERY]
        counts = conn.execute(
            sa.select(table.c.stream_id, sa.func.count())
            .where(table.c.stream_id.in_(chunk))
            .group_by(table.c.stream_id)
        ).all()
        left = {str(stream_id): n for stream_id, n in counts}
        yield from ((left[s], s) for s in chunk if left.get(s))


def _dedupe(report: ResidueReport) -> None:
    seen: set[tuple[str, str, str]] = set()
    unique = []
    for f in report.findings:
        key = (f.kind, f.location, f.detail)
        if key not in seen:
            seen.add(key)
            unique.append(f)
    report.findings = unique
