"""An import run is on the audit log as a run: who ran it, the format, how it ended and its
counts (``import.ran``), never a file name or a record; a dry run writes nothing.

Until 2026-12-05 an import left only its chunks' ``capture.accepted`` entries: a
compliance reader could not tell a bulk load of 10,000 records from an app's traffic, nor
see the records a run refused.
"""

from __future__ import annotations

import json

import pytest

from domain.errors import InvalidInputError, StoreBusyError
from tests.kernel.conftest import consent
from tests.kernel.test_import_formats import CHAT_DEFAULTS, chat, door
from uprof.kernel import Uprof
from uprof.services import importer

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
    assert entry["outcome"] == "failed"  # read, not yet written: nothing written
    assert entry["counts"] == {"lines": 0, "captured": 0, "subjects": 0, "skipped": 0, "failed": 0}


def test_a_run_that_fails_after_writing_records_what_it_wrote(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks written before the failure stay written (a re-run skips them): the entry
    says how many, as a run that ends does (until 2026-12-05 it carried no counts)."""
    consent(kernel)
    monkeypatch.setattr(importer, "CHUNK", 1)

    def lines() -> object:
        yield chat(("I live in Lisbon", "Noted."), **AT)
        yield chat(("I like jazz", "Me too."), ("I swim", "Nice."), **AT)
        raise OSError("the disk went away")

    with pytest.raises(OSError, match="disk went away"):
        door(kernel).import_interactions(lines(), fmt="openai", defaults=CHAT_DEFAULTS)
    (entry,) = runs(kernel)
    assert entry["outcome"] == "failed"
    assert entry["counts"] == {"lines": 2, "captured": 3, "subjects": 1, "skipped": 0, "failed": 0}


def test_a_failed_run_whose_audit_entry_cannot_be_written_raises_its_own_error(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator sees why the import failed, not why its audit entry then did (which
    used to replace it: the CLI printed only "the audit log is locked"); the audit
    failure is a note on the import's error and a logged error."""
    consent(kernel)
    record = kernel.audit.record

    def busy_at_import_ran(action: str, **fields: object) -> None:
        if action == "import.ran":
            raise StoreBusyError("the audit log is locked by another writer")
        record(action, **fields)

    monkeypatch.setattr(kernel.audit, "record", busy_at_import_ran)

    def lines() -> object:
        yield chat(("I live in Lisbon", "Noted."), **AT)
        raise OSError("the disk went away")

    with pytest.raises(OSError, match="disk went away") as raised:
        door(kernel).import_interactions(lines(), fmt="openai", defaults=CHAT_DEFAULTS)
    notes = getattr(raised.value, "__notes__", [])
    assert any("import.ran" in n and "locked by another writer" in n for n in notes), notes


def test_an_unknown_format_is_refused_naming_the_field_before_anything_is_read(
    kernel: Uprof,
) -> None:
    with pytest.raises(InvalidInputError) as refused:
        door(kernel).import_interactions([], fmt="csv; drop", defaults=CHAT_DEFAULTS)
    assert refused.value.field == "format"
    assert runs(kernel) == []
