"""Import interactions from a JSONL file: validate everything, check consent, then write.

Nothing is written unless every line parses and every (subject, app, purpose)
in the file has consent in force, so a bad file never leaves half its lines behind.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pydantic import ValidationError

from domain.errors import ConsentRequiredError, InvalidInputError, SubjectErasedError
from domain.profile import CAPTURE_CATEGORY
from uprof.kernel import Uprof
from uprof.schemas.capture import InteractionIn

BATCH = 1_000


@dataclass(frozen=True)
class ImportReport:
    lines: int
    captured: int
    subjects: int


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


def import_interactions(
    kernel: Uprof, lines: Iterable[str], progress: Callable[[int], None] | None = None
) -> ImportReport:
    rows = parse_lines(lines)
    check_consents(kernel, rows)
    captured = 0
    start = 0
    while start < len(rows):
        # Consecutive lines of one subject go in one transaction.
        end = start
        while end < len(rows) and end - start < BATCH and rows[end].subject == rows[start].subject:
            end += 1
        acks = kernel.capture_many(rows[start].subject, [r.to_domain() for r in rows[start:end]])
        captured += len(acks)
        if progress is not None:
            progress(len(acks))
        start = end
    return ImportReport(len(rows), captured, len({r.subject for r in rows}))
