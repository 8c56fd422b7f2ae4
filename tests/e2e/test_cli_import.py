"""`uprof import` with chat and Mem0 files: dry run, per-record failures, strict, re-runs."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from uprof.cli.main import app as cli

APP = "app:planner"


def _run(data: list[str], *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, [*data, *args])
    return result.exit_code, result.stdout, result.stderr


def test_chat_import_dry_run_failures_strict_and_rerun(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path / "data"), "--embedder", "hashing"]
    code, out, err = _run(
        data,
        *("consent", "grant", "--subject", "alice", "--app", APP),
        *("--category", "*", "--purpose", "personalization", "--collected-by", "form:1"),
    )
    assert code == 0, out + err
    chats = tmp_path / "chats.jsonl"
    good = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "I live in Lisbon"},
            {"role": "assistant", "content": "Noted."},
        ],
        "session_id": "c-1",
    }
    lines = [json.dumps(good).encode(), b"{broken", json.dumps({**good, "session_id": "c-2"})]
    chats.write_bytes(
        b"\n".join(line if isinstance(line, bytes) else line.encode() for line in lines)
    )
    flags = [
        "--format",
        "openai",
        "--app",
        APP,
        "--subject",
        "alice",
        "--at",
        "2025-03-01T10:00:00Z",
    ]

    code, out, err = _run(data, "import", str(chats), *flags, "--dry-run")
    assert code == 1
    assert "would capture 2 interactions from 3 records" in out and "dry run" in out
    assert "line 2: (line): not valid JSON" in err

    code, out, err = _run(data, "import", str(chats), *flags, "--strict")
    assert code == 1 and "strict: nothing was written" in out

    code, out, err = _run(data, "import", str(chats), *flags)
    assert code == 1 and "captured 2 interactions" in out and "1 records failed" in out

    chats.write_text("\n".join([json.dumps(good), json.dumps({**good, "session_id": "c-2"})]))
    code, out, err = _run(data, "import", str(chats), *flags)
    assert code == 0, out + err
    assert "captured 0 interactions" in out and "skipped 2 already captured" in out


def test_mem0_import_needs_an_app_and_names_the_field(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path / "data"), "--embedder", "hashing"]
    _run(
        data,
        *("consent", "grant", "--subject", "alice", "--app", APP),
        *("--category", "*", "--purpose", "personalization", "--collected-by", "form:1"),
    )
    export = tmp_path / "mem0.json"
    export.write_text(
        json.dumps(
            {
                "results": [
                    {
                        "id": "m-1",
                        "memory": "Likes jazz",
                        "user_id": "alice",
                        "created_at": "2024-07-26T10:00:00Z",
                    }
                ]
            },
            indent=2,
        )
    )
    code, out, err = _run(data, "import", str(export), "--format", "mem0")
    assert code == 1 and "results[0]: app_id" in err
    code, out, err = _run(data, "import", str(export), "--format", "mem0", "--app", APP)
    assert code == 0 and "captured 1 interactions" in out, out + err
    code, out, err = _run(data, "import", str(export), "--format", "xml")
    assert code == 2


def test_the_import_examples_in_the_cli_docs_import(tmp_path: Path) -> None:
    """docs/cli.md's chat and interaction examples are records the importer accepts."""
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")
    section = doc.split("## Importing files", 1)[1].split("\n## ", 1)[0]
    blocks = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", section, re.S)]
    assert [("messages" in b) for b in blocks] == [False, True]
    data = ["--data-dir", str(tmp_path / "data"), "--embedder", "hashing"]
    _run(
        data,
        *("consent", "grant", "--subject", "alice", "--app", APP),
        *("--category", "*", "--purpose", "personalization", "--collected-by", "form:1"),
    )
    for number, block in enumerate(blocks):
        path = tmp_path / f"example-{number}.jsonl"
        path.write_text(json.dumps(block) + "\n")
        code, out, err = _run(data, "import", str(path), "--app", APP)
        assert code == 0, out + err
        assert "captured 1 interactions" in out


ALICE = ("--app", APP, "--subject", "alice")


def _granted(tmp_path: Path) -> list[str]:
    data = ["--data-dir", str(tmp_path / "data"), "--embedder", "hashing"]
    _run(
        data,
        *("consent", "grant", "--subject", "alice", "--app", APP),
        *("--category", "*", "--purpose", "personalization", "--collected-by", "form:1"),
    )
    return data


def _chat_line(text: str, role: str = "user") -> bytes:
    message = {"role": role, "content": text}
    return json.dumps({"messages": [message], "created_at": "2025-03-01T10:00:00Z"}).encode()


def test_the_files_own_text_in_a_failure_is_not_read_as_markup(tmp_path: Path) -> None:
    """A role of "[/x]" was echoed into a Rich markup string: the CLI crashed with a
    MarkupError after the import had written, and printed no report."""
    data = _granted(tmp_path)
    chats = tmp_path / "chats.jsonl"
    chats.write_bytes(b"\n".join([_chat_line("I live in Lisbon"), _chat_line("x", "[/x]")]))
    code, out, err = _run(data, "import", str(chats), "--format", "openai", *ALICE)
    assert code == 1, out + err
    assert "line 2: messages[0].role: '[/x]' is not user" in err
    assert "captured 1 interactions from 2 records" in out


def test_a_device_or_a_pipe_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    """/dev/zero has no newline and no end (the counting pass read it forever); a FIFO
    was drained by the counting pass and then blocked the import."""
    import os

    data = _granted(tmp_path)
    code, out, err = _run(data, "import", "/dev/zero", "--app", APP)
    assert code == 2 and "not a regular file" in out + err
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code, out, err = _run(data, "import", str(fifo), "--app", APP)
    assert code == 2 and "not a regular file" in out + err


def test_a_huge_line_is_reported_without_reading_it_into_memory(tmp_path: Path) -> None:
    """`for line in file` held a whole line (a file without newlines is one line) before
    the 4 MiB check: a 48 MiB line took 48 MiB twice (counting, importing). Now at most
    4 MiB + 1 of a line is held; the line fails, the next one imports, and --strict
    reads the file again instead of keeping it in memory."""
    import tracemalloc

    data = _granted(tmp_path)
    chats = tmp_path / "chats.jsonl"
    with chats.open("wb") as file:
        file.write(b'{"messages": "' + b"x" * (48 * 1024 * 1024) + b'"}\n')
        file.write(_chat_line("I live in Lisbon") + b"\n")
    tracemalloc.start()
    try:
        code, out, err = _run(data, "import", str(chats), "--format", "openai", *ALICE)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 1, out + err
    assert "line 1: (line): longer than 4194304 bytes" in err
    assert "captured 1 interactions from 2 records" in out
    assert peak < 24 * 1024 * 1024, peak
    good = tmp_path / "good.jsonl"
    good.write_bytes(_chat_line("I like jazz") + b"\n" + _chat_line("I like tea"))
    code, out, err = _run(data, "import", str(good), *ALICE, "--strict")
    assert code == 0 and "captured 2 interactions from 2 records" in out, out + err


def test_a_file_changed_between_its_readings_is_not_read_again(tmp_path: Path) -> None:
    """--strict reads the file twice (checked, then written) instead of holding it: a file
    changed in between must not be written unchecked."""
    import os

    import pytest

    from domain.errors import UprofError
    from uprof.facade import FileLines

    path = tmp_path / "f.jsonl"
    path.write_bytes(_chat_line("I like jazz") + b"\n")
    lines = FileLines(path)
    assert len(list(lines)) == 1
    assert len(list(lines)) == 1  # unchanged: read again
    path.write_bytes(_chat_line("I like jazz and tea, a lot") + b"\n")
    os.utime(path, ns=(1, 1))
    with pytest.raises(UprofError, match="changed while it was being imported"):
        list(lines)
