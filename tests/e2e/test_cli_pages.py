"""The CLI's lists page with --limit and --cursor (its own SQLite folder: one backend)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from uprof.cli.main import app as cli

APP = "app:planner"


def _run(data: list[str], *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, [*data, *args])
    return result.exit_code, result.stdout, result.stderr


def _cursor(stderr: str) -> str | None:
    found = re.search(r"--cursor (\S+)", stderr)
    return found.group(1) if found else None


def test_lists_page_with_limit_and_cursor(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path / "data"), "--embedder", "hashing"]
    for subject in ("alice", "bob", "carol"):
        code, out, err = _run(
            data,
            *("consent", "grant", "--subject", subject, "--app", APP),
            *("--category", "*", "--purpose", "personalization", "--collected-by", "form:1"),
        )
        assert code == 0, out + err
    for i in range(3):
        code, out, err = _run(
            data,
            *("capture", "--subject", "alice", "--app", APP, "--agent", "agent:one"),
            *("--text", f"I like tea number {i}", "--at", f"2025-01-0{i + 1}T09:00:00Z"),
        )
        assert code == 0, out + err

    code, out, err = _run(data, "subjects", "list", "--limit", "2")
    assert code == 0, err
    first = json.loads(out)
    assert len(first["items"]) == 2 and first["next_cursor"] == _cursor(err)
    code, out, err = _run(data, "subjects", "list", "--cursor", first["next_cursor"])
    rest = json.loads(out)
    assert len(rest["items"]) == 1 and rest["next_cursor"] is None and "more:" not in err
    pseudonyms = {s["pseudonym"] for s in first["items"] + rest["items"]}
    assert len(pseudonyms) == 3

    code, out, err = _run(data, "profile", "memories", "--subject", "alice", "--limit", "2")
    assert code == 0, err
    memories = json.loads(out)["items"]
    code, out, _ = _run(
        data, "profile", "memories", "--subject", "alice", "--cursor", _cursor(err) or ""
    )
    memories += json.loads(out)["items"]
    assert len({m["item_id"] for m in memories}) == len(memories) >= 3

    code, out, err = _run(data, "audit", "entries", "--action", "capture.accepted", "--limit", "1")
    assert code == 0, err
    assert [e["entry"]["action"] for e in json.loads(out)["items"]] == ["capture.accepted"]
    cursor = _cursor(err)
    assert cursor is not None
    # The cursor is bound to its filters: without them it is refused, exit 2, naming cursor.
    code, out, err = _run(data, "audit", "entries", "--cursor", cursor)
    assert code == 2 and "cursor" in err

    code, out, err = _run(data, "consent", "list", "--subject", "alice", "--cursor", "c1.bad.bad")
    assert code == 2 and "cursor" in err
    code, out, err = _run(data, "consent", "list", "--subject", "alice")
    assert code == 0 and len(json.loads(out)) == 1

    code, out, err = _run(data, "erase", "subject", "--subject", "bob")
    assert code == 0, err
    code, out, err = _run(data, "audit", "receipts")
    assert code == 0 and len(json.loads(out)["items"]) == 1

    code, out, err = _run(data, "subjects", "list", "--limit", "501")
    assert code == 2
