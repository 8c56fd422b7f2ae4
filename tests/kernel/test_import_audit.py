"""An import run is on the audit log as a run: who ran it, the format, how it ended and its
counts (``import.ran``), never a file name or a record; a dry run writes nothing.

Until 2026-12-05 an import left only its chunks' ``capture.accepted`` entries: a
compliance reader could not tell a bulk load of 10,000 records from an app's traffic, nor
see the records a run refused.
"""

from __future__ import annotations

import json

import pytest

from domain.errors import InvalidInputError
from tests.kernel.conftest import consent
from tests.kernel.test_import_formats import CHAT_DEFAULTS, chat, door
from uprof.kernel import Uprof

AT = {"created_at": "2025-03-01T10:00:00Z"}


def runs(kernel: Uprof) -> list[dict[str, object]]:
    return [e.entry for e in kernel.audit_entries(action="import.ran")]


def test_a_run_records_its_format_outcome_counts_and_operator_and_nothing_of_the_file(
    kernel: Uprof,
) -> None:
    consent(kernel)
    lines = [chat(("I live in Lisbon", "Noted."), ("I like jazz", "Me too."), **AT), "{not json"]

    report = door(kernel).import_interactions(lines, fmt="openai", defaults=CHAT_DEFAULTS)

    assert (report.captured, len(report.failed)) == (2, 1)
    (entry,) = runs(kernel)
    assert entry["reason_code"] == "openai" and entry["outcome"] == "completed"
    assert entry["counts"] == {"lines": 2, "captured": 2, "subjects": 1, "skipped": 0, "failed": 1}
    assert entry["principal"] == "operator:local#cli"
    assert set(entry) == {
        "action",
        "tenant",
        "recorded_at",
        "principal",
        "reason_code",
        "outcome",
        "counts",
    }
    assert "Lisbon" not in json.dumps(entry)


def test_a_dry_run_records_nothing_and_a_strict_refusal_records_a_refused_run(
    kernel: Uprof,
) -> None:
    consent(kernel)
    lines = [chat(("I live in Lisbon", "Noted."), **AT), "{not json"]

    door(kernel).import_interactions(lines, fmt="openai", defaults=CHAT_DEFAULTS, dry_run=True)
    assert runs(kernel) == []

    report = door(kernel).import_interactions(
        lines, fmt="openai", defaults=CHAT_DEFAULTS, strict=True
    )
    assert report.refused and report.captured == 0
    (entry,) = runs(kernel)
    assert entry["outcome"] == "refused"
    assert entry["counts"] == {"lines": 2, "captured": 0, "subjects": 0, "skipped": 0, "failed": 1}


def test_a_run_that_raises_is_recorded_as_failed(kernel: Uprof) -> None:
    consent(kernel)

    def lines() -> object:
        yield chat(("I live in Lisbon", "Noted."), **AT)
        raise OSError("the disk went away")

    with pytest.raises(OSError, match="disk went away"):
        door(kernel).import_interactions(lines(), fmt="openai", defaults=CHAT_DEFAULTS)
    (entry,) = runs(kernel)
    assert entry["outcome"] == "failed" and "counts" not in entry


def test_an_unknown_format_is_refused_naming_the_field_before_anything_is_read(
    kernel: Uprof,
) -> None:
    with pytest.raises(InvalidInputError) as refused:
        door(kernel).import_interactions([], fmt="csv; drop", defaults=CHAT_DEFAULTS)
    assert refused.value.field == "format"
    assert runs(kernel) == []
