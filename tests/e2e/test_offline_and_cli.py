"""End to end on the embedded default: real models offline, the JSONL importer, the CLI."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pytest_socket import disable_socket, enable_socket
from typer.testing import CliRunner

from uprof.bootstrap import bootstrap
from uprof.cli.main import app as cli
from uprof.services.importer import import_interactions
from uprof.settings import Settings


@pytest.fixture
def no_network() -> Iterator[None]:
    disable_socket(allow_unix_socket=False)
    try:
        yield
    finally:
        enable_socket()


@pytest.mark.model
def test_real_models_run_with_the_network_blocked(tmp_path: Path, no_network: None) -> None:
    with pytest.raises(Exception, match="socket"):
        socket.create_connection(("127.0.0.1", 9))  # the block is real
    k = bootstrap(Settings(data_dir=tmp_path / "data", embedder="minilm"))
    try:
        k.grant_consent("ana", app_id="app:planner", categories=["*"], purposes=["personalization"])
        k.capture_many(
            "ana",
            [
                line_to_interaction("I'm learning to play the cello with my teacher Rosa."),
                line_to_interaction("I'm vegan and I love spicy food."),
            ],
        )
        result = k.slice(
            "ana",
            "what instrument do I practise?",
            budget_tokens=64,
            purpose="personalization",
            app_id="app:planner",
            agent_id="agent:one",
        )
        assert "cello" in result.text
        assert result.n_tokens <= 64
    finally:
        k.close()


def line_to_interaction(text: str):  # type: ignore[no-untyped-def]
    from uprof.schemas.capture import InteractionIn

    return InteractionIn(
        subject="ana",
        app_id="app:planner",
        agent_id="agent:one",
        user_input=text,
        occurred_at=datetime(2026, 2, 1, tzinfo=UTC),
        sharing="shared",
    ).to_domain()


def _lines(*rows: dict[str, object]) -> list[str]:
    return [json.dumps(r) for r in rows]


def _row(subject: str, text: str, app: str = "app:planner") -> dict[str, object]:
    return {
        "subject": subject,
        "app_id": app,
        "agent_id": "agent:one",
        "user_input": text,
        "occurred_at": "2026-02-01T10:00:00Z",
        "sharing": "shared",
    }


def test_importer_reports_bad_lines_and_imports_the_good_ones(tmp_path: Path) -> None:
    k = bootstrap(Settings(data_dir=tmp_path / "data", embedder="hashing"))
    try:
        k.grant_consent("ana", app_id="app:planner", categories=["*"], purposes=["personalization"])
        before = k.app.max_notification_id()
        bad = _lines(_row("ana", "hello"), {**_row("ana", "x"), "occurred_at": "yesterday"})
        strict = import_interactions(k, bad, strict=True)
        assert strict.refused and strict.captured == 0
        assert [str(p).split(":")[0:2] for p in strict.failed] == [["line 2", " occurred_at"]]
        assert k.app.max_notification_id() == before  # strict: nothing written
        report = import_interactions(k, _lines(_row("ana", "hello"), _row("bob", "hi")))
        assert report.captured == 1
        assert [(p.where, p.field) for p in report.failed] == [("line 2", "subject")]
        assert "no consent" in report.failed[0].message
        report = import_interactions(k, _lines(_row("ana", "hello"), _row("ana", "I live in Rome")))
        assert report.captured == 2
    finally:
        k.close()


def test_cli_walkthrough(tmp_path: Path) -> None:
    runner = CliRunner()
    data = ["--data-dir", str(tmp_path / "data"), "--embedder", "hashing"]

    def run(*args: str) -> str:
        result = runner.invoke(cli, [*data, *args])
        assert result.exit_code == 0, result.output
        return result.output

    run(
        "consent",
        "grant",
        "--subject",
        "ana",
        "--app",
        "app:planner",
        "--category",
        "*",
        "--purpose",
        "personalization",
    )
    run(
        "capture",
        "--subject",
        "ana",
        "--app",
        "app:planner",
        "--agent",
        "agent:one",
        "--text",
        "I want to learn the cello",
        "--sharing",
        "shared",
        "--at",
        "2026-02-01T10:00:00Z",
    )
    assert "learn the cello" in run("profile", "show", "--subject", "ana")
    assert "cello" in run(
        "slice",
        "--subject",
        "ana",
        "--app",
        "app:planner",
        "--agent",
        "agent:one",
        "--purpose",
        "personalization",
        "--budget",
        "64",
        "what am I learning?",
    )
    # The slice itself was recorded as an event: one more to project.
    assert json.loads(run("projections", "lag"))["projection_pending"] >= 1
    run("projections", "run")
    assert json.loads(run("projections", "lag"))["caught_up"] is True
    receipt = tmp_path / "receipt.json"
    key = tmp_path / "key.pem"
    trail = tmp_path / "trail.jsonl"
    run("erase", "subject", "--subject", "ana", "--out", str(receipt))
    run("audit", "public-key", "--out", str(key))
    assert "receipt verified" in run(
        "audit", "verify-receipt", str(receipt), "--public-key", str(key)
    )
    run("audit", "export", "--out", str(trail))
    assert "verified" in run("audit", "verify", str(trail), "--public-key", str(key))
    assert "residue: 0" in run("audit", "residue", "--term", "cello")

    # A capture for the erased subject is refused (exit 5: erased) and stores nothing.
    result = runner.invoke(
        cli,
        [
            *data,
            "capture",
            "--subject",
            "ana",
            "--app",
            "app:planner",
            "--agent",
            "a",
            "--text",
            "hi",
        ],
    )
    assert result.exit_code == 5
    assert "erased" in result.output

    # A tampered trail fails verification and names the entry.
    lines = trail.read_text().splitlines()
    lines[2] = lines[2].replace('"action":"', '"action":"x', 1)
    trail.write_text("\n".join(lines) + "\n")
    result = runner.invoke(cli, [*data, "audit", "verify", str(trail), "--public-key", str(key)])
    assert result.exit_code == 1
    assert "line 3" in result.output


def test_cli_backup_erase_restore_recreate_and_key_folder(tmp_path: Path) -> None:
    runner = CliRunner()
    keys = tmp_path / "vault" / "keys"
    data = ["--data-dir", str(tmp_path / "data"), "--key-dir", str(keys), "--embedder", "hashing"]

    def run(*args: str, code: int = 0) -> str:
        result = runner.invoke(cli, [*data, *args])
        assert result.exit_code == code, result.output
        # The console wraps lines at its width, so where a break falls depends on the
        # length of the paths printed: compare words, not line breaks.
        return " ".join(result.output.split())

    grant = (
        "consent",
        "grant",
        "--subject",
        "ana",
        "--app",
        "app:planner",
        "--category",
        "*",
        "--purpose",
        "personalization",
    )
    run(*grant)
    run(
        "capture",
        "--subject",
        "ana",
        "--app",
        "app:planner",
        "--agent",
        "agent:one",
        "--text",
        "I live in Qzxclitown",
        "--at",
        "2026-02-01T10:00:00Z",
    )
    assert (keys / "keks.json").exists() and not (tmp_path / "data" / "keks.json").exists()
    assert "no key material" in run("backup", "--to", str(tmp_path / "bk"))
    run("erase", "subject", "--subject", "ana", "--out", str(tmp_path / "r.json"))
    assert "1 erased subjects" in run("restore", "--from", str(tmp_path / "bk"))
    # Erased stays erased after the restore: exit 5 and the 410 error's words.
    assert "erased" in run("profile", "show", "--subject", "ana", code=5)
    assert "erased" in run(*grant, code=5)
    assert "new pseudonym subj_" in run("subjects", "recreate", "--subject", "ana")
    run(*grant)
    # A key folder inside the data folder is refused at start, naming the setting.
    bad = runner.invoke(
        cli,
        [
            "--data-dir",
            str(tmp_path / "data"),
            "--key-dir",
            str(tmp_path / "data" / "k"),
            "profile",
            "show",
            "--subject",
            "ana",
        ],
    )
    assert bad.exit_code == 2 and "key_dir" in bad.output
