"""Import a file of interactions, record by record, through the consent gate.

A run is **per record**: each record (a line; a memory of a Mem0 JSON document) is read,
checked and captured on its own. A bad one (unreadable, a field out of shape, an app the
policy does not let capture, no consent in force, an erased subject) is reported with
where it is and why, and the good ones are imported. ``strict`` makes the run all or
nothing as far as checking goes: every record is checked first, and nothing is written
unless every one passes. ``dry_run`` checks and counts and writes nothing (not even an
audit entry: a denial found by a dry run is not audited, since nothing was attempted).

Re-importing is safe (I14): a record is skipped, and counted as skipped, when its
subject already has a capture from the same app with the same ``source_ref`` (matched by
keyed hash in the captures view; refs are not stored in plaintext) or when its
``idempotency_key`` was already captured. Both also hold against a concurrent import of
the same file: each such record carries a token (a keyed hash of its app and key, or of
its app and source ref) that the subject's stream records with the capture, so two
writers of one record cannot both save it. Chat and Mem0 records get a derived
``source_ref`` (``uprof.services.import_formats``), so their re-runs skip too.

An erased capture stays erased (bug IC): a record whose (app, source_ref) names a capture
erased at the subject's request (``erase_capture``, a withdrawal with ``erase``) is
skipped however late, and named in ``ImportReport.erased``. The subject's stream keeps
the ref's keyed token for the subject's life (``SubjectProfile.ref_erased``, decided
again by the capture's save). Live captures are not affected: a user may say the same
thing again through the app (decision 0147-erased-refs-stay-erased).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from uuid import UUID

from domain.errors import InvalidInputError, ReadTimeoutError, SubjectErasedError, UprofError
from domain.profile import CAPTURE_CATEGORY, SubjectProfile
from uprof.kernel import Uprof
from uprof.schemas.capture import InteractionIn
from uprof.services.capture import check_interaction
from uprof.services.idempotency import check_key
from uprof.services.import_formats import (
    FORMATS,
    ImportDefaults,
    ImportProblem,
    ImportRecord,
    read_records,
)

_log = logging.getLogger(__name__)

#: Records checked and written together (bounds memory on a file of any length).
CHUNK = 1_000
#: Most interactions one capture transaction takes (the capture service's own bound).
BATCH = 1_000

#: ``may_capture(app_id, purpose)``: None when the policy allows, else why not.
CapturePermit = Callable[[str, str], str | None]


@dataclass(frozen=True)
class ImportReport:
    """What a run did (or, dry, would do): records read, interactions captured, subjects,
    interactions skipped as captured already, and every record that failed, with why."""

    lines: int
    captured: int
    subjects: int
    #: Interactions not written because they were captured already (same app and
    #: source_ref, or the same idempotency key), or repeated within the file.
    skipped: int = 0
    failed: tuple[ImportProblem, ...] = field(default_factory=tuple)
    dry_run: bool = False
    #: True when a strict run found a failing record and therefore wrote nothing.
    refused: bool = False
    #: Why the run stopped before the end of the file (the counts are what was done
    #: until then; the records after were not read), or None when it read it all.
    stopped: str | None = None
    #: The error ``stopped`` tells of: the CLI exits by its kind (docs/cli.md's table), so
    #: a damaged policy store met by a record's check exits 7, not 1 (review of 0204,
    #: bug QX: 0204 made that check raise the store's own error).
    stopped_by: UprofError | None = field(default=None, compare=False, repr=False)
    #: The records (where each is) skipped because their capture was erased at the
    #: subject's request; each is counted in ``skipped`` too.
    erased: tuple[str, ...] = ()


def parse_lines(lines: Iterable[str]) -> list[InteractionIn]:
    """Parse uprof JSONL strictly; raise InvalidInputError naming the first bad line."""
    rows: list[InteractionIn] = []
    for parsed in read_records(lines, "interactions", ImportDefaults()):
        if isinstance(parsed, ImportProblem):
            raise InvalidInputError(str(parsed), field=parsed.field)
        rows.extend(parsed.rows)
    return rows


def import_interactions(
    kernel: Uprof,
    lines: Iterable[bytes | str],
    progress: Callable[[int], None] | None = None,
    *,
    fmt: str = "interactions",
    defaults: ImportDefaults | None = None,
    may_capture: CapturePermit | None = None,
    dry_run: bool = False,
    strict: bool = False,
) -> ImportReport:
    """Import every record of ``lines``; see the module docstring for the rules.

    ``may_capture`` is the facade's policy decision per (app, purpose); without it (the
    kernel's own callers) every app may capture and only consent decides.

    A run that could write (not a dry run) ends with one ``import.ran`` audit entry: the
    format, how it ended and its counts, never a file name or a record. Each written
    chunk has its own ``capture.accepted`` entries; this one says that a bulk run, and
    whose, wrote them, and what it refused (docs/audit-format.md).
    """
    if fmt not in FORMATS:
        raise InvalidInputError(f"format must be one of {', '.join(FORMATS)}", field="format")
    writing: list[_Run] = []
    try:
        report = _import(
            kernel,
            lines,
            progress,
            fmt=fmt,
            defaults=defaults or ImportDefaults(),
            may_capture=may_capture,
            dry_run=dry_run,
            strict=strict,
            writing=writing,
        )
    except BaseException as error:
        if not dry_run:
            _record_failed_run(kernel, fmt, writing, error)
        raise
    if not dry_run:
        outcome = "refused" if report.refused else "stopped" if report.stopped else "completed"
        kernel.audit.record("import.ran", reason_code=fmt, outcome=outcome, counts=_counts(report))
    return report


def _counts(report: ImportReport) -> dict[str, int]:
    return {
        "lines": report.lines,
        "captured": report.captured,
        "subjects": report.subjects,
        "skipped": report.skipped,
        "failed": len(report.failed),
    }


def _record_failed_run(kernel: Uprof, fmt: str, writing: list[_Run], error: BaseException) -> None:
    """Write the ``import.ran`` entry of a run that raised ``error``: its counts are what
    it wrote before (those captures stay; a re-run skips them), zeros when it wrote
    nothing. If that append fails too, ``error`` is still what the caller gets (the
    operator must learn why the import failed first): the audit failure is a note on it
    and a logged error, never a replacement (docs/reliability.md)."""
    done = writing[-1].report() if writing else ImportReport(0, 0, 0)
    try:
        kernel.audit.record("import.ran", reason_code=fmt, outcome="failed", counts=_counts(done))
    except Exception as audit_error:
        why = f"{type(audit_error).__name__}: {audit_error}"
        error.add_note(f"the import.ran audit entry of this failed run was not written ({why})")
        _log.error(
            "import failed (%s) and its import.ran audit entry was not written (%s)",
            type(error).__name__,
            why,
        )


def _import(
    kernel: Uprof,
    lines: Iterable[bytes | str],
    progress: Callable[[int], None] | None,
    *,
    fmt: str,
    defaults: ImportDefaults,
    may_capture: CapturePermit | None,
    dry_run: bool,
    strict: bool,
    writing: list[_Run] | None = None,
) -> ImportReport:
    """``writing`` gets the run that writes (not the checking pass of ``strict``), so
    that a caller whose run raised can still count what it wrote."""
    if strict and not dry_run:
        # An iterable that can be read twice (a list, ``FileLines``) is checked, then
        # written, without holding the file in memory; a one-shot iterator is kept.
        materialised = list(lines) if isinstance(lines, Iterator) else lines
        checked = _import(
            kernel,
            materialised,
            None,
            fmt=fmt,
            defaults=defaults,
            may_capture=may_capture,
            dry_run=True,
            strict=False,
        )
        if checked.failed or checked.stopped:
            return ImportReport(
                checked.lines,
                0,
                0,
                checked.skipped,
                checked.failed,
                dry_run=False,
                refused=True,
                stopped=checked.stopped,
                stopped_by=checked.stopped_by,
            )
        lines = materialised
    run = _Run(kernel, may_capture or (lambda app, purpose: None), dry_run, progress)
    if writing is not None and not dry_run:
        writing.append(run)
    try:
        for chunk in _chunks(read_records(lines, fmt, defaults), CHUNK):
            run.chunk(chunk)
    except UprofError as error:
        # The views behind the log, the file changed: what was written so far stays
        # written (a re-run skips it) and the report says so, and where it stopped.
        return replace(run.report(), stopped=str(error), stopped_by=error)
    return run.report()


def _chunks(
    records: Iterator[ImportRecord | ImportProblem], size: int
) -> Iterator[list[ImportRecord | ImportProblem]]:
    while chunk := list(itertools.islice(records, size)):
        yield chunk


@dataclass
class _Pending:
    record: ImportRecord
    row: InteractionIn
    token: str | None


class _Run:
    """One import: the checks, the writes and the counts, chunk after chunk."""

    def __init__(
        self,
        kernel: Uprof,
        may_capture: CapturePermit,
        dry_run: bool,
        progress: Callable[[int], None] | None,
    ) -> None:
        self.kernel = kernel
        self.may_capture = may_capture
        self.dry_run = dry_run
        self.progress = progress
        self.records = 0
        self.captured = 0
        self.skipped = 0
        self.subjects: set[str] = set()
        self.failed: list[ImportProblem] = []
        self.erased: list[str] = []
        self._failed_where: set[str] = set()
        self._consent: dict[tuple[str, str, str], str | None] = {}
        self._permits: dict[tuple[str, str], str | None] = {}
        self._tokens_seen: set[str] = set()
        self._profiles: dict[str, SubjectProfile] = {}
        self._views_fresh = False

    def report(self) -> ImportReport:
        return ImportReport(
            self.records,
            self.captured,
            len(self.subjects),
            self.skipped,
            tuple(self.failed),
            dry_run=self.dry_run,
            erased=tuple(dict.fromkeys(self.erased)),
        )

    def _fail(self, problem: ImportProblem) -> None:
        if problem.where not in self._failed_where:
            self._failed_where.add(problem.where)
            self.failed.append(problem)

    # ------------------------------------------------------------------ checks

    def chunk(self, chunk: Sequence[ImportRecord | ImportProblem]) -> None:
        self.records += len(chunk)
        # The policy may change while a run goes on (another process, `uprof policy
        # revoke`): what it allowed is decided again for every chunk, so a revoked right
        # stops the run's writes within a chunk plus the policy's refresh bound. A refusal
        # stands for the run (it was audited, once).
        self._permits = {key: why for key, why in self._permits.items() if why is not None}
        # So is consent (decision 0067: a retry is decided again): a record skipped as
        # captured already is reported so only under a consent in force for its chunk.
        self._consent = {key: why for key, why in self._consent.items() if why is not None}
        # The subjects' streams loaded for this chunk's consent checks, asked again
        # whether a record's capture was erased (one load per subject per chunk).
        self._profiles = {}
        good: list[ImportRecord] = []
        for parsed in chunk:
            if isinstance(parsed, ImportProblem):
                self._fail(parsed)
                continue
            problem = self._check(parsed)
            if problem is None:
                good.append(parsed)
            else:
                self._fail(problem)
        pending = self._deduplicated(good)
        if self.dry_run:
            self.captured += len(pending)
            self.subjects.update(p.row.subject for p in pending)
        else:
            self._write(pending)
        if self.progress is not None:
            self.progress(len(chunk))

    def _check(self, record: ImportRecord) -> ImportProblem | None:
        for index, row in enumerate(record.rows):
            prefix = f"interactions[{index}]." if len(record.rows) > 1 else ""
            try:
                check_interaction(row.to_domain())
                if row.idempotency_key is not None:
                    check_key(row.idempotency_key)
            except InvalidInputError as error:
                return ImportProblem(record.where, prefix + (error.field or "(record)"), str(error))
            denied = self._permit(row.app_id, row.purpose)
            if denied:
                return ImportProblem(record.where, "app_id", denied)
            refused = self._consented(row)
            if refused:
                return ImportProblem(record.where, "subject", refused)
        return None

    def _permit(self, app_id: str, purpose: str) -> str | None:
        key = (app_id, purpose)
        if key not in self._permits:
            self._permits[key] = self.may_capture(app_id, purpose)
        return self._permits[key]

    def _consented(self, row: InteractionIn) -> str | None:
        key = (row.subject, row.app_id, row.purpose)
        if key in self._consent:
            return self._consent[key]
        kernel = self.kernel
        try:
            handle = kernel.subjects.find(row.subject)
        except SubjectErasedError:
            why: str | None = "its subject was erased"
        except InvalidInputError as error:
            why = str(error)
        else:
            profile = None if handle is None else self._profile(row.subject, handle.stream_id)
            allowed = profile is not None and profile.has_consent(
                app_id=row.app_id,
                category=CAPTURE_CATEGORY,
                purpose=row.purpose,
                at=kernel.clock.now(),
            )
            why = (
                None
                if allowed
                else f"app {row.app_id!r} has no consent in force for this subject and "
                f"purpose {row.purpose!r}"
            )
        self._consent[key] = why
        return why

    def _profile(self, subject: str, stream_id: UUID) -> SubjectProfile:
        if subject not in self._profiles:
            self._profiles[subject] = self.kernel.app.load(stream_id)
        return self._profiles[subject]

    # ------------------------------------------------------------- idempotency

    def _deduplicated(self, records: Sequence[ImportRecord]) -> list[_Pending]:
        rows = [_Pending(r, row, self._token(row)) for r in records for row in r.rows]
        if any(p.row.source_ref for p in rows) and not self._views_fresh:
            # The captures view must show every capture acknowledged so far to match refs.
            if not self.kernel.project_log(self.kernel.settings.read_wait_timeout_s):
                raise ReadTimeoutError(
                    "the captures view is behind the log, so records already captured "
                    "cannot be told apart; nothing more was imported"
                )
            self._views_fresh = True
        known = _already_captured(self.kernel, [p.row for p in rows])
        erased = _erased(self.kernel, [p.row for p in rows], self._profile)
        fresh: list[_Pending] = []
        for pending, captured, gone in zip(rows, known, erased, strict=True):
            token = pending.token
            if gone:
                self.erased.append(pending.record.where)
                self.skipped += 1
                continue
            if captured or (token is not None and token in self._tokens_seen):
                self.skipped += 1  # captured before, or repeated in this file
                continue
            if token is not None:
                self._tokens_seen.add(token)
            fresh.append(pending)
        return fresh

    def _token(self, row: InteractionIn) -> str | None:
        if row.idempotency_key is not None:
            return self.kernel.request_token(row.app_id, check_key(row.idempotency_key))
        if row.source_ref:
            return self.kernel.request_token(row.app_id, row.source_ref, namespace="source_ref")
        return None

    # ------------------------------------------------------------------ writes

    def _write(self, pending: list[_Pending]) -> None:
        start = 0
        while start < len(pending):
            # Consecutive interactions of one subject go in one transaction.
            subject = pending[start].row.subject
            end = start
            while (
                end < len(pending) and end - start < BATCH and pending[end].row.subject == subject
            ):
                end += 1
            group = pending[start:end]
            start = end
            if any(p.record.where in self._failed_where for p in group):
                group = [p for p in group if p.record.where not in self._failed_where]
            if not group:
                continue
            try:
                outcome = self.kernel.capture_once(
                    subject,
                    [p.row.to_domain() for p in group],
                    item_tokens=[p.token for p in group],
                )
            except UprofError as error:
                # Consent withdrawn or the subject erased meanwhile, another writer kept
                # winning: these records failed; the run goes on with the next ones.
                for p in group:
                    self._fail(ImportProblem(p.record.where, "(record)", str(error)))
                continue
            self.captured += len(outcome.acks)
            self.skipped += outcome.skipped
            # Erased meanwhile (after this chunk's check): the stream's save said so.
            self.erased.extend(group[i].record.where for i in outcome.erased)
            self.subjects.add(subject)


def _erased(
    kernel: Uprof,
    rows: list[InteractionIn],
    load: Callable[[str, UUID], SubjectProfile],
) -> list[bool]:
    """Per row: was a capture of its subject from its app with its source_ref erased at
    the subject's request? Asked of the subject's stream, which keeps the ref's keyed
    token with no expiry; the capture's save asks again (bug IC)."""
    if kernel.idempotency is None or not any(row.source_ref for row in rows):
        return [False] * len(rows)
    profiles: dict[str, SubjectProfile | None] = {}
    for row in rows:
        if row.source_ref and row.subject not in profiles:
            try:
                handle = kernel.subjects.find(row.subject)
            except SubjectErasedError:
                handle = None  # erased since its check: its write fails, naming it
            profiles[row.subject] = None if handle is None else load(row.subject, handle.stream_id)
    erased: list[bool] = []
    for row in rows:
        profile = profiles.get(row.subject) if row.source_ref else None
        erased.append(
            profile is not None
            and profile.ref_erased(
                kernel.request_token(row.app_id, row.source_ref, namespace="source_ref")
            )
        )
    return erased


def _already_captured(kernel: Uprof, rows: list[InteractionIn]) -> list[bool]:
    """Per row: is there a capture of its subject from its app with its source_ref?"""
    found: dict[tuple[str, str], set[str]] = {}
    wanted: dict[tuple[str, str], set[str]] = {}
    for row in rows:
        if row.source_ref:
            wanted.setdefault((row.subject, row.app_id), set()).add(row.source_ref)
    for (subject, app_id), refs in wanted.items():
        handle = kernel.subjects.find(subject)
        found[(subject, app_id)] = (
            set()
            if handle is None
            else kernel.queries.captured_source_refs(str(handle.stream_id), app_id, sorted(refs))
        )
    return [
        bool(row.source_ref) and row.source_ref in found.get((row.subject, row.app_id), set())
        for row in rows
    ]
