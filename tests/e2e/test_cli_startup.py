"""The CLI loads only what a command needs: no model for a command that embeds nothing.

Checked by the modules a fresh process has loaded (not by timing, which belongs to the
benchmarks: docs/performance.md has `uprof --help` and a CLI capture in seconds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = (
    "sentence_transformers",
    "torch",
    "fastapi",
    "mcp",
    "uprof.kernel",
    "uprof.mcp.server",
    # Tracing is off unless configured, and off it imports nothing (decision 0035-observability).
    "opentelemetry",
    # What a capture on SQLite does not need (decision 0035-observability): the migration
    # tool (the stores are at head), the PostgreSQL driver, the sparse matrices of the
    # slice index, the extractor and its HTTP client.
    "alembic",
    "psycopg",
    "scipy",
    "uprof.adapters.extraction",
    "httpx",
)

_PROBE = """
import json, sys
from typer.testing import CliRunner
from uprof.cli.main import app
args = json.loads(sys.argv[1])
result = CliRunner().invoke(app, args)
heavy = json.loads(sys.argv[2])
print(json.dumps({"exit": result.exit_code, "output": result.output,
                  "loaded": [m for m in heavy if m in sys.modules]}))
"""


def _run(args: list[str], heavy: tuple[str, ...] = HEAVY) -> dict[str, object]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(args), json.dumps(heavy)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_help_loads_no_kernel_server_or_model() -> None:
    seen = _run(["--help"])
    assert seen["exit"] == 0
    assert seen["loaded"] == []


#: What a command line that opens no store needs none of (0249-cli-start-cost): the
#: storage toolkit (reached through ``audit``'s package import from the settings' lock
#: file checks), the settings' model, the audit log, the retry library and the token
#: counter's library. ~0.6 s of CPU of every ``uprof --help`` on main at aef8439f.
#: (pydantic is not listed: typer loads it itself to parse a command's options.)
NOT_AT_THE_START = (
    "sqlalchemy",
    "pydantic_settings",
    "audit.log",
    "uprof.settings",
    "tenacity",
    "tiktoken",
    "asyncio",
)


@pytest.mark.parametrize(
    ("args", "exit_code"),
    [
        (["--help"], 0),
        (["apps", "list", "--help"], 0),
        (["capture", "--help"], 0),
        (["apps", "list", "--no-such-option"], 2),  # refused by the parser
        (["no-such-command"], 2),
    ],
    ids=["help", "apps-list-help", "capture-help", "bad-option", "bad-command"],
)
def test_a_command_line_that_opens_no_store_loads_no_storage_or_settings(
    args: list[str], exit_code: int
) -> None:
    seen = _run(args, NOT_AT_THE_START)
    assert seen["exit"] == exit_code, seen["output"]
    assert seen["loaded"] == []


def test_a_capture_opens_the_stores_but_does_not_load_the_model(tmp_path: Path) -> None:
    base = ["--data-dir", str(tmp_path / "data"), "--key-dir", str(tmp_path / "keys")]
    granted = _run(
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
        ]
    )
    assert granted["exit"] == 0, granted["output"]
    captured = _run(
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
            "I live in Lisbon",
        ]
    )
    assert captured["exit"] == 0, captured["output"]
    assert "captured" in str(captured["output"])
    loaded = captured["loaded"]
    assert isinstance(loaded, list) and "uprof.kernel" in loaded  # the stores were opened
    assert "sentence_transformers" not in loaded and "torch" not in loaded
    unneeded_for_a_capture = (
        "opentelemetry",
        "alembic",
        "psycopg",
        "scipy",
        "uprof.adapters.extraction",
        # A capture counts no tokens: the table is not loaded (tiktoken's module itself is,
        # ~4 ms, through the bench commands' import of benchmarks.bench_common).
        "uprof.adapters.tokens",
    )
    for unneeded in unneeded_for_a_capture:
        assert unneeded not in loaded, unneeded
