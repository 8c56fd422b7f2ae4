"""Import interactions from a JSONL file: validate everything, check consent, then write.

Nothing is written unless every line parses and every (subject, app, purpose)
in the file has consent in force, so a bad file never leaves half its lines behind.

Re-importing is safe (I14): a record is skipped, and counted as skipped, when its
subject already has a capture from the same app with the same ``source_ref``
(matched by keyed hash in the captures view; refs are not stored in plaintext) or
when its ``idempotency_key`` was already captured. Both also hold against a
concurrent import of the same file: each such record carries a token (a keyed hash
of its app and key, or of its app and source ref) that the subject's stream records
with the capture, so two writers of one record cannot both save it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pydantic import ValidationError

from domain.errors import (
    ConsentRequiredError,
    InvalidInputError,
    ReadTimeoutError,
    SubjectErasedError,
)
from domain.profile import CAPTURE_CATEGORY
from uprof.kernel import Uprof
from uprof.schemas.capture import InteractionIn
from uprof.services.idempotency import check_key

BATCH = 1_000


@dataclass(frozen=True)
class ImportReport:
    lines: int
    captured: int
    subjects: int
    #: Records not written because they were captured already (same app and
    #: source_ref, or the same idempotency key), or repeated within the file.
    skipped: int = 0


def parse_lines(lines: Iterable[str]) -> list[InteractionIn]:
    """Parse every line; raise InvalidInputError naming the first bad line and field."""
    parsed = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as e:
            raise InvalidInputError(f"line {number}: not valid JSON ({e.msg})") from None
        try:
            parsed.append(InteractionIn.model_validate(raw))
        except ValidationError as e:
            first = e.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "(line)"
            raise InvalidInputError(f"line {number}: field {field}: {first['msg']}") from None
    return parsed


def check_consents(kernel: Uprof, rows: list[InteractionIn]) -> None:
    now = kernel.clock.now()
    seen: set[tuple[str, str, str]] = set()
    for number, row in enumerate(rows, start=1):
        key = (row.subject, row.app_id, row.purpose)
        if key in seen:
            continue
        seen.add(key)
        try:
            handle = kernel.subjects.find(row.subject)
        except SubjectErasedError:
            raise SubjectErasedError(
                f"record {number}: its subject was erased; nothing was imported"
            ) from None
        allowed = handle is not None and kernel.app.load(handle.stream_id).has_consent(
            app_id=row.app_id, category=CAPTURE_CATEGORY, purpose=row.purpose, at=now
        )
        if not allowed:
            raise ConsentRequiredError(
                f"record {number}: app {row.app_id!r} has no consent in force for its subject "
                f"and purpose {row.purpose!r}; nothing was imported"
            )


def _record_token(kernel: Uprof, row: InteractionIn) -> str | None:
    if row.idempotency_key is not None:
        return kernel.request_token(row.app_id, check_key(row.idempotency_key))
    if row.source_ref:
        return kernel.request_token(row.app_id, row.source_ref, namespace="source_ref")
    return None


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


def import_interactions(
    kernel: Uprof, lines: Iterable[str], progress: Callable[[int], None] | None = None
) -> ImportReport:
    rows = parse_lines(lines)
    check_consents(kernel, rows)
    if any(row.source_ref for row in rows):
        # The captures view must show every capture acknowledged so far to match refs.
        if not kernel.project_log(kernel.settings.read_wait_timeout_s):
            raise ReadTimeoutError(
                "the captures view is behind the log, so records already captured "
                "cannot be told apart; nothing was imported"
            )
    known = _already_captured(kernel, rows)
    tokens = [_record_token(kernel, row) for row in rows]
    pending: list[int] = []
    seen: set[str] = set()
    skipped = 0
    for index, token in enumerate(tokens):
        if known[index] or (token is not None and token in seen):
            skipped += 1  # captured before, or repeated in this file
            continue
        if token is not None:
            seen.add(token)
        pending.append(index)
    if skipped and progress is not None:
        progress(skipped)
    captured = 0
    start = 0
    while start < len(pending):
        # Consecutive lines of one subject go in one transaction.
        subject = rows[pending[start]].subject
        end = start
        while end < len(pending) and end - start < BATCH and rows[pending[end]].subject == subject:
            end += 1
        chunk = pending[start:end]
        outcome = kernel.capture_once(
            subject,
            [rows[i].to_domain() for i in chunk],
            item_tokens=[tokens[i] for i in chunk],
        )
        captured += len(outcome.acks)
        skipped += outcome.skipped
        if progress is not None:
            progress(len(chunk))
        start = end
    return ImportReport(len(rows), captured, len({r.subject for r in rows}), skipped)
