"""Importing OpenAI-style chats and Mem0 exports through the facade, on both backends.

Per record: hostile lines are reported by line number and field while the good lines
import; an app the policy does not allow is refused per record (and audited); a dry run
writes nothing, not even an audit entry; re-runs skip what was captured.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from domain.principal import Principal
from tests.kernel.conftest import APP, consent
from tests.kernel.test_idempotency import captured
from uprof.facade import Facade, ImportDefaults
from uprof.kernel import Uprof

OPERATOR = Principal.local_operator("default")
CHAT_DEFAULTS = ImportDefaults(app_id=APP, subject="alice", agent_id="agent:import")


def chat(*turns: tuple[str, str], **extra: object) -> str:
    messages: list[dict[str, object]] = [{"role": "system", "content": "be helpful"}]
    for user, assistant in turns:
        messages.append({"role": "user", "content": user})
        messages.append({"role": "assistant", "content": assistant})
    return json.dumps({"messages": messages, **extra})


def door(kernel: Uprof) -> Facade:
    return Facade(kernel, OPERATOR)


def test_openai_chats_import_one_interaction_per_turn_and_rerun_skips(kernel: Uprof) -> None:
    consent(kernel)
    lines = [
        chat(
            ("I live in Lisbon", "Noted."),
            ("I want to learn the cello", "Great!"),
            session_id="conv-1",
            created_at="2025-03-01T10:00:00Z",
        ),
        chat(("I like jazz", "Me too."), metadata={"created_at": 1735725600}),  # Unix seconds
    ]
    report = door(kernel).import_interactions(lines, fmt="auto", defaults=CHAT_DEFAULTS)
    assert (report.lines, report.captured, report.skipped, report.failed) == (2, 3, 0, ())
    rows = captured(kernel)
    assert len(rows) == 3
    kernel.process()
    events = kernel.export_subject("alice")["captured_events"]
    turn = next(e for e in events if e["user_input"] == "I live in Lisbon")
    assert turn["agent_response"] == "Noted." and turn["session_id"] == "conv-1"
    assert turn["source_ref"] == "chat:conv-1:0"
    assert turn["occurred_at"].startswith("2025-03-01T10:00:00")
    jazz = next(e for e in events if e["user_input"] == "I like jazz")
    assert jazz["occurred_at"].startswith("2025-01-01T10:00:00")  # 1735725600 in UTC
    again = door(kernel).import_interactions(lines, fmt="openai", defaults=CHAT_DEFAULTS)
    assert (again.captured, again.skipped) == (0, 3)
    assert len(captured(kernel)) == 3


def test_hostile_chat_lines_are_reported_by_line_and_the_good_ones_import(
    kernel: Uprof,
) -> None:
    consent(kernel)
    good = chat(("I live in Porto", "ok"), created_at="2025-03-01T10:00:00Z")
    lines: list[bytes | str] = [
        good,
        "[" * 100_000,  # nested past the parser's recursion limit
        b'{"messages": [{"role": "user", "content": "caf\xe9"}]}',  # not UTF-8
        json.dumps(["not", "an", "object"]),
        chat(("no time anywhere", "ok")),
        json.dumps(
            {"messages": [{"role": "hacker", "content": "x"}], "created_at": "2025-01-01T00:00Z"}
        ),
        json.dumps(
            {
                "messages": [{"role": "user", "content": "x" * 40_000}],
                "created_at": "2025-03-01T10:00:00Z",
            }
        ),
        json.dumps(
            {
                "messages": [{"role": "user", "content": "nul \x00 inside"}],
                "created_at": "2025-03-01T10:00:00Z",
            }
        ),
        json.dumps({"messages": [{"role": "user", "content": {"oops": 1}}]}),
        chat(("naive time", "ok"), created_at="2025-03-01T10:00:00"),
        "",
        chat(("I like tea", "ok"), created_at="2025-03-02T10:00:00Z"),
    ]
    report = door(kernel).import_interactions(lines, fmt="openai", defaults=CHAT_DEFAULTS)
    assert report.captured == 2
    failed = {p.where: p.field for p in report.failed}
    assert failed == {
        "line 2": "(line)",
        "line 3": "(line)",
        "line 4": "(line)",
        "line 5": "created_at",
        "line 6": "messages[0].role",
        "line 7": "messages[0].user_input",
        "line 8": "messages[0].user_input",
        "line 9": "messages[0].content",
        "line 10": "created_at",
    }
    assert len(captured(kernel)) == 2  # the good lines, nothing of the bad ones
    assert report.lines == 11  # the blank line is not a record


def test_mem0_exports_import_as_document_and_as_jsonl(kernel: Uprof) -> None:
    consent(kernel)
    consent(kernel, subject="bob")
    memories = [
        {
            "id": "f38b689d-6b24-45b7-bced-17fbb4d8bac7",
            "memory": "Is a vegetarian",
            "user_id": "alice",
            "hash": "62bc074f56d1f909f1b4c2b639f56f6a",
            "metadata": {"source": "onboarding", "score": 3},
            "categories": ["food"],
            "created_at": "2024-07-25T23:57:00.108347-07:00",
            "updated_at": "2024-07-26T23:57:00.108367-07:00",
        },
        {
            "id": "a1",
            "memory": "Lives in Porto",
            "user_id": "bob",
            "metadata": None,
            "created_at": "2024-07-26T10:00:00Z",
        },
        {"id": "a2", "memory": "", "user_id": "bob", "created_at": "2024-07-26T10:00:00Z"},
        {"id": "a3", "memory": "No user", "created_at": "2024-07-26T10:00:00Z"},
    ]
    defaults = ImportDefaults(app_id=APP)
    document = json.dumps({"results": memories}, indent=2).splitlines()
    report = door(kernel).import_interactions(document, fmt="auto", defaults=defaults)
    assert report.captured == 2 and report.subjects == 2
    assert {(p.where, p.field) for p in report.failed} == {
        ("results[2]", "memory"),
        ("results[3]", "user_id"),
    }
    kernel.process()
    events = kernel.export_subject("alice")["captured_events"]
    (event,) = events
    assert event["source_ref"] == "mem0:f38b689d-6b24-45b7-bced-17fbb4d8bac7"
    assert event["user_input"] == "Is a vegetarian"
    assert event["occurred_at"].startswith("2024-07-26T06:57:00")  # -07:00 to UTC
    # The same memories one per line (JSONL) are recognised as captured already.
    jsonl = [json.dumps(m) for m in memories[:2]]
    again = door(kernel).import_interactions(jsonl, fmt="mem0", defaults=defaults)
    assert (again.captured, again.skipped, again.failed) == (0, 2, ())


def test_a_dry_run_counts_and_writes_nothing(kernel: Uprof) -> None:
    consent(kernel)
    lines = [
        chat(("I live in Lisbon", "ok"), created_at="2025-03-01T10:00:00Z"),
        chat(("bob says hi", "ok"), subject="bob", created_at="2025-03-01T10:00:00Z"),
    ]
    log_before = kernel.app.max_notification_id()
    audit_before = kernel.audit_log.size()
    seen: list[int] = []
    report = door(kernel).import_interactions(
        lines, fmt="openai", defaults=CHAT_DEFAULTS, dry_run=True, progress=seen.append
    )
    assert report.dry_run and report.captured == 1
    assert [p.where for p in report.failed] == ["line 2"]  # bob gave no consent
    assert sum(seen) == 2
    assert kernel.app.max_notification_id() == log_before
    assert kernel.audit_log.size() == audit_before
    assert not kernel.subjects.find("bob")


def test_an_app_without_policy_is_refused_per_record_and_audited(kernel: Uprof) -> None:
    consent(kernel)
    rogue = ImportDefaults(app_id="app:rogue", subject="alice")
    line = chat(("I live in Lisbon", "ok"), created_at="2025-03-01T10:00:00Z")
    before = kernel.app.max_notification_id()
    report = door(kernel).import_interactions([line, line], fmt="openai", defaults=rogue)
    assert report.captured == 0
    assert [(p.where, p.field) for p in report.failed] == [
        ("line 1", "app_id"),
        ("line 2", "app_id"),
    ]
    assert "policy" in report.failed[0].message
    assert kernel.app.max_notification_id() == before
    denials = [e.entry for e in kernel.audit_entries(action="access.denied")]
    assert [d.get("app_id") for d in denials] == ["app:rogue"]  # once per (app, purpose)
    # A dry run asks the same policy but records no denial.
    door(kernel).import_interactions([line], fmt="openai", defaults=rogue, dry_run=True)
    assert len(list(kernel.audit_entries(action="access.denied"))) == 1


def test_a_native_line_naming_another_app_is_decided_by_that_apps_policy(kernel: Uprof) -> None:
    consent(kernel)
    row = {
        "subject": "alice",
        "agent_id": "agent:one",
        "user_input": "hello",
        "occurred_at": datetime(2025, 1, 1, tzinfo=UTC).isoformat(),
    }
    lines = [json.dumps({**row, "app_id": APP}), json.dumps({**row, "app_id": "app:rogue"})]
    report = door(kernel).import_interactions(lines)
    assert report.captured == 1 and [p.where for p in report.failed] == ["line 2"]


def test_native_lines_failing_the_kernel_checks_are_reported_by_field(kernel: Uprof) -> None:
    """Checks the kernel makes itself (ids as tokens, an agent of another app, empty text)
    name the field of the record that failed them, like the schema's checks do, and lose
    nothing else."""
    consent(kernel)
    row = {
        "subject": "alice",
        "app_id": APP,
        "agent_id": "agent:one",
        "user_input": "hello",
        "occurred_at": datetime(2025, 1, 1, tzinfo=UTC).isoformat(),
    }
    lines = [
        json.dumps({**row, "agent_id": "app:calendar/agent:one"}),  # another app's agent
        json.dumps({**row, "agent_id": "agent one"}),
        json.dumps({**row, "purpose": "bad purpose"}),
        json.dumps({**row, "agent_type": "Bad Type"}),
        json.dumps({**row, "user_input": "   "}),
        json.dumps({**row, "source_ref": "good-1"}),
    ]
    report = door(kernel).import_interactions(lines)
    assert {p.where: p.field for p in report.failed} == {
        "line 1": "agent_id",
        "line 2": "agent_id",
        "line 3": "purpose",
        "line 4": "agent_type",
        "line 5": "user_input",
    }
    assert report.captured == 1 and len(captured(kernel)) == 1


def test_a_number_too_long_to_convert_fails_its_line_and_the_run_goes_on(kernel: Uprof) -> None:
    """A JSON integer of more than Python's 4300 digits raised ValueError (not a
    JSONDecodeError) out of the reader: the run stopped mid-file with no report."""
    consent(kernel)
    good = chat(("I live in Porto", "ok"), created_at="2025-03-01T10:00:00Z")
    huge = '{"messages": [], "created_at": ' + "9" * 5_000 + "}"
    later = chat(("I like tea", "ok"), created_at="2025-03-02T10:00:00Z")
    report = door(kernel).import_interactions(
        [good, huge, later], fmt="openai", defaults=CHAT_DEFAULTS
    )
    assert report.captured == 2 and len(captured(kernel)) == 2
    assert [(p.where, p.field) for p in report.failed] == [("line 2", "(line)")]
    assert "too many digits" in report.failed[0].message
    first = door(kernel).import_interactions([huge], fmt="auto", defaults=CHAT_DEFAULTS)
    assert ["too many digits" in p.message for p in first.failed] == [True]  # detection too


def test_a_time_out_of_range_in_utc_fails_its_line_and_the_run_goes_on(kernel: Uprof) -> None:
    """0001-01-01T00:00+01:00 is valid ISO 8601 but before year 1 in UTC: converting it
    raised OverflowError out of the checks and stopped the run mid-file."""
    consent(kernel)

    def row(text: str, at: str) -> str:
        return json.dumps(
            {
                "subject": "alice",
                "app_id": APP,
                "agent_id": "agent:one",
                "user_input": text,
                "occurred_at": at,
            }
        )

    lines = [
        row("I live in Porto", "2025-03-01T10:00:00Z"),
        row("too early", "0001-01-01T00:00:00+01:00"),
        row("too late", "9999-12-31T23:59:00-01:00"),
        row("I like tea", "2025-03-02T10:00:00Z"),
    ]
    report = door(kernel).import_interactions(lines, fmt="interactions")
    assert report.captured == 2 and len(captured(kernel)) == 2
    assert [(p.where, p.field) for p in report.failed] == [
        ("line 2", "occurred_at"),
        ("line 3", "occurred_at"),
    ]


def test_a_key_given_twice_fails_its_line_naming_the_key(kernel: Uprof) -> None:
    """`{"subject": "alice", ..., "subject": "bob"}` was imported for bob (json keeps the
    last key, other readers of the file the first): which subject or app a record names
    must not depend on the reader."""
    consent(kernel)
    consent(kernel, subject="bob")
    good = json.dumps(
        {
            "subject": "alice",
            "app_id": APP,
            "agent_id": "agent:one",
            "user_input": "hi",
            "occurred_at": "2025-03-01T10:00:00Z",
        }
    )
    twice = good[:-1] + ', "subject": "bob"}'
    nested = json.dumps({"messages": [{"role": "user", "content": "a"}]})
    nested = nested.replace('"content": "a"', '"content": "a", "content": "b"')
    report = door(kernel).import_interactions([good, twice], fmt="interactions")
    assert report.captured == 1 and len(captured(kernel)) == 1
    assert [(p.where, p.field) for p in report.failed] == [("line 2", "subject")]
    chats = door(kernel).import_interactions([nested], fmt="openai", defaults=CHAT_DEFAULTS)
    assert [(p.where, p.field) for p in chats.failed] == [("line 1", "content")]


def test_a_mem0_document_over_the_bound_fails_before_it_is_held_whole(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Mem0 JSON document is parsed whole: every line of it was kept, without bound."""
    from uprof.services import import_formats

    consent(kernel)
    memory = {
        "id": "m-1",
        "memory": "Likes jazz",
        "user_id": "alice",
        "created_at": "2024-07-26T10:00:00Z",
    }
    document = json.dumps([memory] * 50, indent=2).splitlines()
    monkeypatch.setattr(import_formats, "MAX_DOCUMENT_BYTES", 1_000, raising=False)
    report = door(kernel).import_interactions(document, fmt="mem0", defaults=CHAT_DEFAULTS)
    assert report.captured == 0 and len(captured(kernel)) == 0
    assert [(p.where, p.field) for p in report.failed] == [("document", "(file)")]
    assert "one memory per line" in report.failed[0].message
    monkeypatch.setattr(import_formats, "MAX_DOCUMENT_BYTES", 1_000_000)
    report = door(kernel).import_interactions(document, fmt="mem0", defaults=CHAT_DEFAULTS)
    assert report.failed == () and len(captured(kernel)) == 1  # 50 copies of one memory


def test_a_failure_quotes_at_most_a_little_of_the_files_text(kernel: Uprof) -> None:
    """A role of a megabyte (the user's words, pasted in the wrong field) was quoted whole
    in the failure printed to the terminal."""
    consent(kernel)
    line = json.dumps(
        {
            "messages": [{"role": "my address is " + "x" * 1_000_000, "content": "hi"}],
            "created_at": "2025-03-01T10:00:00Z",
        }
    )
    report = door(kernel).import_interactions([line], fmt="openai", defaults=CHAT_DEFAULTS)
    assert [(p.where, p.field) for p in report.failed] == [("line 1", "messages[0].role")]
    assert len(report.failed[0].message) < 120
