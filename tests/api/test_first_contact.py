"""Stumbles a new user hit, each kept as a test: a clear error naming the field, nothing lost.

Issue 18 lists them; each test here fails on the behaviour that was found.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner, Result

from tests.api.conftest import Apps, bearer, grant, interaction
from uprof.cli.main import app as cli

#: The HTTP tests run on both backends; the CLI tests use their own SQLite folder.
both_backends = pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)


def _plain(output: str) -> str:
    """CLI output without Rich's box drawing and line wrapping."""
    return " ".join(output.replace("│", " ").split())


def _fields(response: httpx.Response) -> list[str]:
    return [f["field"] for f in response.json()["error"]["fields"]]


@both_backends
def test_a_sharing_typo_is_refused_over_rest_and_nothing_is_captured(
    http: httpx.Client, apps: Apps
) -> None:
    grant(http, apps.planner)
    typo = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I like tea", sharing="sharde")},
    )
    assert typo.status_code == 422, typo.text
    assert _fields(typo) == ["sharing"]
    assert "shared:" in typo.json()["error"]["fields"][0]["message"]  # says what is accepted
    profile = http.post(
        "/v1/profile/read", headers=bearer(apps.planner_operator), json={"subject": "alice"}
    )
    assert profile.status_code == 200, profile.text
    assert profile.json()["memories"] == []
    ok = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I like tea", sharing="shared:coach")},
    )
    assert ok.status_code == 201, ok.text


@both_backends
def test_a_sharing_typo_in_proposals_is_refused(http: httpx.Client, apps: Apps) -> None:
    grant(http, apps.planner)
    response = http.post(
        "/v1/proposals",
        headers=bearer(apps.planner),
        json={
            "subject": "alice",
            "agent_id": "agent:one",
            "sharing": "Shared",
            "proposals": [{"kind": "memory", "text": "likes tea"}],
        },
    )
    assert response.status_code == 422, response.text
    assert _fields(response) == ["sharing"]


def _cli_capture(tmp_path: Path, *extra: str) -> Result:
    """``uprof capture`` of one line for alice, with ``extra`` options appended."""
    return CliRunner().invoke(cli, [
        "--data-dir", str(tmp_path / "data"), "--key-dir", str(tmp_path / "keys"), "capture",
        "--subject", "alice", "--app", "app:planner", "--agent", "agent:one",
        "--text", "I like tea", *extra])  # fmt: skip


def test_cli_capture_refuses_a_sharing_typo_before_touching_the_stores(tmp_path: Path) -> None:
    result = _cli_capture(tmp_path, "--sharing", "sharde")
    assert result.exit_code == 2, result.output
    said = _plain(result.output)
    assert "'--sharing'" in said and "'shared:<agent type>[,<agent type>...]'" in said
    assert not (tmp_path / "data").exists()  # refused before any store was opened


def test_cli_time_error_shows_the_accepted_form(tmp_path: Path) -> None:
    result = _cli_capture(tmp_path, "--at", "yesterday")
    assert result.exit_code == 2
    assert "for example --at 2026-12-01T09:30:00Z" in _plain(result.output)


@both_backends
def test_a_body_that_is_not_utf8_is_a_declared_400(http: httpx.Client, apps: Apps) -> None:
    response = http.post(
        "/v1/slices",
        headers={**bearer(apps.planner), "Content-Type": "application/json"},
        content=b"\xbb\xc1{",
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "malformed_body"
    declared = http.get("/openapi.json").json()["paths"]["/v1/slices"]["post"]["responses"]
    assert {"400", "403", "404", "410", "503"} <= set(declared)


@both_backends
def test_an_unknown_item_names_its_field_in_the_hint_and_the_body(
    http: httpx.Client, apps: Apps
) -> None:
    grant(http, apps.planner)
    response = http.post(
        "/v1/evidence/read",
        headers=bearer(apps.planner_operator),
        json={"subject": "alice", "item_id": "zzz"},
    )
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["hint"].startswith("fix item_id ")
    assert [f["field"] for f in error["fields"]] == ["item_id"]


@both_backends
def test_the_unknown_subject_hint_says_how_a_subject_comes_to_exist(
    http: httpx.Client, apps: Apps
) -> None:
    # A capture does not create a subject (consent comes first); the hint must not say so.
    capture = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "nobody", **interaction("I like tea")},
    )
    assert capture.status_code in (403, 404), capture.text
    response = http.post(
        "/v1/profile/read", headers=bearer(apps.planner_operator), json={"subject": "nobody"}
    )
    assert response.status_code == 404, response.text
    hint = response.json()["error"]["hint"]
    assert "capture creates" not in hint and "consent" in hint


def test_cli_slice_for_an_uncovered_purpose_says_why_it_is_empty(tmp_path: Path) -> None:
    base = [
        "--data-dir",
        str(tmp_path / "data"),
        "--key-dir",
        str(tmp_path / "keys"),
        "--embedder",
        "hashing",
    ]
    runner = CliRunner()
    granted = runner.invoke(
        cli,
        [
            *base,
            "consent",
            "grant",
            "--subject",
            "alice",
            "--app",
            "app:planner",
            "--category",
            "*",
            "--purpose",
            "personalization",
        ],
    )
    assert granted.exit_code == 0, granted.output
    captured = runner.invoke(
        cli,
        [
            *base,
            "capture",
            "--subject",
            "alice",
            "--app",
            "app:planner",
            "--agent",
            "agent:one",
            "--text",
            "I like green tea",
            "--sharing",
            "shared",
        ],
    )
    assert captured.exit_code == 0, captured.output
    result = runner.invoke(
        cli,
        [
            *base,
            "slice",
            "--subject",
            "alice",
            "--app",
            "app:planner",
            "--agent",
            "agent:one",
            "--purpose",
            "marketing",
            "tea?",
        ],
    )
    assert result.exit_code == 0, result.output
    said = _plain(result.output)
    assert "hint:" in said and "purpose 'marketing'" in said
    assert "uprof policy show" in said
