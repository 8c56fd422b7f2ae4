"""``uprof consent withdraw --erase``: the operator's way to carry out a user's withdrawal
with erasure, with the signed receipt the REST and MCP doors give (both backends)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from tests.conftest import Backend
from uprof.cli.main import app as cli

PLANNER, CALENDAR = "app:planner", "app:calendar"


def _data(backend: Backend) -> list[str]:
    args = ["--data-dir", str(backend.data_dir / "data"), "--embedder", "hashing"]
    if backend.kind == "postgres":
        args += ["--database-url", backend.url]
    return args


def _run(backend: Backend, *args: str, code: int = 0) -> str:
    result = CliRunner().invoke(cli, [*_data(backend), *args])
    assert result.exit_code == code, result.output
    # Rich wraps at the console's width: compare words, not line breaks.
    return " ".join(result.output.split())


def _grant_and_capture(backend: Backend, app: str, purpose: str, text: str) -> None:
    _run(
        backend,
        *("consent", "grant", "--subject", "ana", "--app", app),
        *("--category", "*", "--purpose", purpose),
    )
    _run(
        backend,
        *("capture", "--subject", "ana", "--app", app, "--agent", "agent:one"),
        *("--text", text, "--purpose", purpose, "--sharing", "shared"),
        *("--at", "2026-02-01T10:00:00Z"),
    )


def _consent_of(backend: Backend, app: str) -> str:
    result = CliRunner().invoke(cli, [*_data(backend), "consent", "list", "--subject", "ana"])
    assert result.exit_code == 0, result.output
    return next(c["consent_id"] for c in json.loads(result.stdout) if c["app"] == app)


def test_withdraw_with_erase_erases_what_the_consent_collected_and_receipts_it(
    backend: Backend, tmp_path: Path
) -> None:
    _grant_and_capture(backend, PLANNER, "personalization", "I live in Qzxclitown")
    _grant_and_capture(backend, CALENDAR, "scheduling", "I meet Rosa on Fridays")
    planner = _consent_of(backend, PLANNER)
    receipt, key = tmp_path / "receipt.json", tmp_path / "key.pem"

    said = _run(
        backend,
        *("consent", "withdraw", "--subject", "ana", "--consent", planner),
        *("--erase", "--out", str(receipt)),
    )

    assert f"consent {planner} withdrawn" in said
    assert "1 captured events erased" in said
    assert "receipt written to" in said and receipt.is_file()
    _run(backend, "audit", "public-key", "--out", str(key))
    assert "receipt verified" in _run(
        backend, "audit", "verify-receipt", str(receipt), "--public-key", str(key)
    )
    body = json.loads(receipt.read_text())["body"]
    assert body["request"]["scope"] == "consent-withdrawal"
    profile = _run(backend, "profile", "show", "--subject", "ana")
    assert "Rosa" in profile  # the calendar app's consent collected that: it stays
    assert "Qzxclitown" not in profile
    assert "residue: 0" in _run(backend, "audit", "residue", "--term", "Qzxclitown")
    # Asking again: nothing of it is left, nothing is written, no second receipt.
    again = _run(
        backend, *("consent", "withdraw", "--subject", "ana", "--consent", planner), "--erase"
    )
    assert "nothing collected under it is left to erase" in again


def test_a_receipt_file_without_erase_is_refused_and_nothing_is_withdrawn(
    backend: Backend, tmp_path: Path
) -> None:
    _grant_and_capture(backend, PLANNER, "personalization", "I live in Qzxclitown")
    planner = _consent_of(backend, PLANNER)

    refused = CliRunner().invoke(
        cli,
        [
            *_data(backend),
            *("consent", "withdraw", "--subject", "ana", "--consent", planner),
            *("--out", str(tmp_path / "r.json")),
        ],
    )

    assert refused.exit_code == 2
    assert "--out" in refused.output and "--erase" in refused.output
    listed = CliRunner().invoke(cli, [*_data(backend), "consent", "list", "--subject", "ana"])
    assert json.loads(listed.stdout)[0]["withdrawn_at"] is None
