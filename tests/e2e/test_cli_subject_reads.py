"""The CLI's reads of a subject's data are on the log as what they showed (SQLite and
PostgreSQL).

``uprof profile evidence --item ID`` shows one item and the captures behind it. Until
2026-12-05 it always read the whole profile first, to expand an id prefix, so every call
left two ``subject.read`` entries: the item's ``evidence`` and a ``profile`` read counting
every attribute, memory, intent and consent of the subject, which the command never
showed. The log, which a subject's "who saw my data" is answered from, said the operator
had seen the whole profile. A full item id now reads and records the item only; a prefix
still reads the profile to find the item (and that read is recorded, as it happened).
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.conftest import Backend
from uprof.cli.main import app as cli

APP = "app:planner"


def _run(data: list[str], *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, [*data, *args])
    return result.exit_code, result.stdout, result.stderr


def _reads(data: list[str]) -> list[str]:
    code, out, err = _run(data, "audit", "entries", "--action", "subject.read", "--limit", "500")
    assert code == 0, err
    return [e["entry"]["reason_code"] for e in json.loads(out)["items"]]


def test_the_evidence_of_one_item_is_recorded_as_that_read_only(backend: Backend) -> None:
    data = ["--data-dir", str(backend.data_dir / "data"), "--embedder", "hashing"]
    if backend.kind == "postgres":
        data += ["--database-url", backend.url]
    code, out, err = _run(
        data,
        *("consent", "grant", "--subject", "alice", "--app", APP),
        *("--category", "*", "--purpose", "personalization", "--collected-by", "form:1"),
    )
    assert code == 0, out + err
    code, out, err = _run(
        data,
        *("capture", "--subject", "alice", "--app", APP, "--agent", "agent:one"),
        *("--text", "I live in Lisbon", "--at", "2025-01-01T09:00:00Z"),
    )
    assert code == 0, out + err
    code, out, err = _run(data, "profile", "memories", "--subject", "alice")
    assert code == 0, err
    item = json.loads(out)["items"][0]["item_id"]
    before = _reads(data)
    assert before == ["memories"]

    code, out, err = _run(data, "profile", "evidence", "--subject", "alice", "--item", item)
    assert code == 0, err
    assert "Lisbon" in out
    assert _reads(data) == [*before, "evidence"]  # not a whole-profile read besides

    # A prefix is found in the profile: that read happened, and is recorded.
    code, out, err = _run(data, "profile", "evidence", "--subject", "alice", "--item", item[:8])
    assert code == 0, err
    assert "Lisbon" in out
    assert _reads(data) == [*before, "evidence", "profile", "evidence"]
