"""``uprof apps create --read ... --purpose ...`` onboards in one step; ``uprof policy``."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.conftest import Backend
from uprof.cli.main import app as cli


def cli_for(backend: Backend):  # type: ignore[no-untyped-def]
    runner = CliRunner()
    base = ["--data-dir", str(backend.data_dir / "data"), "--embedder", "hashing"]
    if backend.kind == "postgres":
        base += ["--database-url", backend.url]

    def run(*args: str, code: int = 0) -> str:
        result = runner.invoke(cli, [*base, *args])
        assert result.exit_code == code, result.output
        return result.output

    return run


def test_apps_create_onboards_an_app_in_one_step(backend: Backend) -> None:
    run = cli_for(backend)
    out = run("apps", "create", "app:x", "--read", "diet,location", "--purpose", "personalization")
    assert "10 rules granted to app:x" in out
    assert out.strip().splitlines()[-1].startswith("upk_")  # the key, printed last
    rules = json.loads(run("policy", "show", "--json"))["rules"]
    mine = sorted((r["action"], r["category"]) for r in rules if r["subject"] == "app:x")
    assert mine == sorted(
        [(a, c) for a in ("capture", "consent", "propose", "read") for c in ("diet", "location")]
        + [("capture", "conversation"), ("consent", "conversation")]
    )
    changes = json.loads(run("policy", "history", "--json"))
    assert {c["requested_by"] for c in changes[1:]} == {"operator:local#cli"}


def test_apps_create_refuses_a_bad_onboarding_before_issuing_a_key(backend: Backend) -> None:
    run = cli_for(backend)
    out = run(
        "apps", "create", "app:x", "--read", "diet,dreams", "--purpose", "personalization", code=2
    )
    assert "read: unknown category" in out
    assert "upk_" not in out
    assert json.loads(run("apps", "list")) == []
    run("apps", "create", "app:x", "--read", "diet", code=2)  # --purpose missing
    assert len(json.loads(run("policy", "history", "--json"))) == 1


def test_policy_grant_revoke_and_show_at_a_past_time(backend: Backend) -> None:
    run = cli_for(backend)
    run(
        "policy",
        "grant",
        "--app",
        "app:planner",
        "--action",
        "read",
        "--category",
        "location",
        "--purpose",
        "personalization",
    )
    out = run("policy", "grant", "--app", "app:planner", "--role", "role:nope", code=2)
    assert "role: unknown role" in out
    run("policy", "revoke", "--app", "app:planner", "--role", "role:assistant")
    changes = json.loads(run("policy", "history", "--json"))
    assert [c["change"] for c in changes] == ["seeded", "rule.added", "role.revoked"]
    then = json.loads(run("policy", "show", "--at", changes[1]["at"], "--json"))
    assert then["version"] == 2
    assistant = {"member": "app:planner", "role": "role:assistant", "tenant": "default"}
    assert assistant in then["assignments"]
    now = json.loads(run("policy", "show", "--json"))
    assert now["version"] == 3 and assistant not in now["assignments"]
