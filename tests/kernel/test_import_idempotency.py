"""Re-running an import skips what was captured already (I14), on both backends."""

from __future__ import annotations

import json

import pytest

from tests.kernel.conftest import APP, consent, say
from tests.kernel.test_idempotency import captured
from uprof.kernel import Uprof
from uprof.services.importer import import_interactions


def record(text: str, *, ref: str = "", key: str | None = None, app: str = APP) -> str:
    row = {
        "subject": "alice",
        "app_id": app,
        "agent_id": "agent:one",
        "user_input": text,
        "occurred_at": "2025-01-01T09:00:00Z",
        "source_ref": ref,
    }
    if key is not None:
        row["idempotency_key"] = key
    return json.dumps(row)


def test_reimporting_a_file_captures_nothing_twice(kernel: Uprof) -> None:
    consent(kernel)
    lines = [record(f"I like tea {i}", ref=f"conv-1:{i}") for i in range(5)]
    lines += [record("keyed line", key="k-1"), record("keyed again", key="k-2")]
    first = import_interactions(kernel, lines)
    assert (first.captured, first.skipped) == (7, 0)
    kernel.ensure_fresh(10)  # extraction of the first import's captures is done
    log_after_first = kernel.app.max_notification_id()
    again = import_interactions(kernel, lines)
    assert (again.captured, again.skipped) == (0, 7)
    assert kernel.app.max_notification_id() == log_after_first  # the log did not grow
    assert len(captured(kernel)) == 7


def test_import_skips_refs_captured_over_the_api_and_repeats_in_the_file(
    kernel: Uprof,
) -> None:
    consent(kernel)
    kernel.capture("alice", say("said over REST", ref="conv-9:1"))
    lines = [
        record("said over REST", ref="conv-9:1"),
        record("new", ref="conv-9:2"),
        record("new", ref="conv-9:2"),
    ]
    report = import_interactions(kernel, lines)
    assert (report.captured, report.skipped) == (1, 2)
    assert len(captured(kernel)) == 2


def test_source_refs_are_per_app(kernel: Uprof) -> None:
    consent(kernel)
    consent(kernel, app="app:calendar")
    import_interactions(kernel, [record("a", ref="r-1")])
    report = import_interactions(kernel, [record("a", ref="r-1", app="app:calendar")])
    assert (report.captured, report.skipped) == (1, 0)


def test_idempotency_keys_are_per_app_in_one_file_and_across_runs(kernel: Uprof) -> None:
    """Another app's record with the same key is its own capture, never skipped as a repeat."""
    consent(kernel)
    consent(kernel, app="app:calendar")
    lines = [record("a", key="k-1"), record("b", key="k-1", app="app:calendar")]
    report = import_interactions(kernel, lines)
    assert (report.captured, report.skipped) == (2, 0)
    again = import_interactions(kernel, [*lines, record("c", key="k-1", app="app:calendar")])
    assert (again.captured, again.skipped) == (0, 3)
    assert len(captured(kernel)) == 2


def test_an_erased_capture_is_not_brought_back_by_a_reimport(kernel: Uprof) -> None:
    consent(kernel)
    import_interactions(kernel, [record("I like tea", ref="r-1")])
    (capture_id,) = captured(kernel)
    kernel.erase_capture("alice", capture_id)
    report = import_interactions(kernel, [record("I like tea", ref="r-1")])
    # Within the retention window the stream's token still says "captured once".
    assert (report.captured, report.skipped) == (0, 1)


def test_cli_import_twice_reports_what_it_skipped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from uprof.cli.main import app as cli

    runner = CliRunner()
    data = ["--data-dir", str(tmp_path / "data"), "--embedder", "hashing"]
    grant = runner.invoke(
        cli,
        [
            *data,
            "consent",
            "grant",
            "--subject",
            "alice",
            "--app",
            APP,
            "--category",
            "*",
            "--purpose",
            "personalization",
        ],
    )
    assert grant.exit_code == 0, grant.output
    file = tmp_path / "in.jsonl"
    file.write_text("\n".join(record(f"I like tea {i}", ref=f"c:{i}") for i in range(3)) + "\n")
    first = runner.invoke(cli, [*data, "import", str(file)])
    assert first.exit_code == 0, first.output
    assert "captured 3 interactions" in first.output and "skipped 0" in first.output
    again = runner.invoke(cli, [*data, "import", str(file)])
    assert again.exit_code == 0, again.output
    assert "captured 0 interactions" in again.output and "skipped 3" in again.output


def test_tokens_survive_a_snapshot(backend, clock) -> None:  # type: ignore[no-untyped-def]
    """150 records cross the snapshot interval (100): a fresh process still skips them all."""
    from tests.kernel.conftest import build_kernel, settings_for

    lines = [record(f"I like tea {i}", key=f"k{i}") for i in range(150)]
    first = build_kernel(settings_for(backend), clock)
    try:
        consent(first)
        assert import_interactions(first, lines).captured == 150
        assert first.app.snapshots is not None
        stream = first.stream_of("alice")
        assert list(first.app.snapshots.get(stream))  # a snapshot was taken
    finally:
        first.close()
    second = build_kernel(settings_for(backend), clock)
    try:
        report = import_interactions(second, lines)
        assert (report.captured, report.skipped) == (0, 150)
    finally:
        second.close()


def test_a_run_stopped_part_way_reports_what_it_wrote_and_why_it_stopped(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The captures view behind the log raised ReadTimeoutError out of the run after
    earlier chunks were written: the caller got an error and no count of what was."""
    from uprof.services import importer

    consent(kernel)
    monkeypatch.setattr(importer, "CHUNK", 1)
    monkeypatch.setattr(kernel, "project_log", lambda timeout_s: False)
    report = import_interactions(kernel, [record("a"), record("b", ref="r-1"), record("c")])
    assert report.captured == 1 and len(captured(kernel)) == 1
    assert report.stopped is not None and "behind the log" in report.stopped
    assert report.lines == 2  # the third record was not read
