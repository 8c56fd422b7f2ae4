"""The CLI while the database does not answer (decision 0188's Left, "CLI not checked
during outage"), on SQLite and PostgreSQL (``tests.conftest.database_down``: PostgreSQL
refuses connections, SQLite's key store cannot be opened).

Bug OW: every command that opens the stores let the driver's ``OperationalError`` out,
a traceback ending in the driver's text (on PostgreSQL the host, port and database
name), exit 1. Now a refusal like every other the CLI gives: ``error: the database did
not answer ...`` and its hint, exit 1, nothing else; and the same commands work once it
answers again.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.conftest import Backend, database_down
from uprof.cli.main import app as cli

PLANNER = "app:planner"
GRANT = ("--subject", "ana", "--app", PLANNER, "--category", "*", "--purpose", "personalization")
SAID = ("--text", "I like tea", "--purpose", "personalization", "--at", "2026-02-01T10:00:00Z")

#: Commands that open the stores, from every group that does (the servers and ``restore``
#: open them their own way, and are answered by the same root group: not run here).
COMMANDS: tuple[tuple[str, ...], ...] = (
    ("consent", "list", "--subject", "ana"),
    ("consent", "grant", *GRANT),
    ("capture", "--subject", "ana", "--app", PLANNER, "--agent", "agent:one", *SAID),
    ("profile", "show", "--subject", "ana"),
    ("subjects", "list"),
    ("apps", "list"),
    ("policy", "show"),
    ("audit", "entries"),
    ("projections", "lag"),
    ("quarantine", "list"),
    ("maintain",),
    ("erase", "subject", "--subject", "ana"),
)


def _data(backend: Backend) -> list[str]:
    args = ["--data-dir", str(backend.data_dir / "data"), "--embedder", "hashing"]
    if backend.kind == "postgres":
        args += ["--database-url", backend.url]
    return args


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_ow_a_command_while_the_database_does_not_answer_says_so_in_a_line(
    backend: Backend, command: tuple[str, ...]
) -> None:
    """Bug OW: a traceback with the driver's text. Now exit 1 with the refusal and its
    hint (rich may wrap the hint), no traceback, nothing of the driver's text but its
    error's name."""
    runner = CliRunner()
    made = runner.invoke(cli, [*_data(backend), "consent", "grant", *GRANT])
    assert made.exit_code == 0, made.output
    with database_down(backend, backend.data_dir / "data.keys"):
        refused = runner.invoke(cli, [*_data(backend), *command])
    # Rich wraps at the console's width: compare words, not line breaks.
    said = " ".join(refused.output.split())
    assert refused.exit_code == 1, refused.output
    assert isinstance(refused.exception, SystemExit), refused.exception  # no traceback
    assert said.startswith("error: the database did not answer ("), said
    assert said.count("error:") == 1 and said.count("hint:") == 1 and len(said) < 200, said
    assert "Traceback" not in said and "127.0.0.1" not in said
    listed = runner.invoke(cli, [*_data(backend), "consent", "list", "--subject", "ana"])
    assert listed.exit_code == 0 and json.loads(listed.stdout), listed.output
