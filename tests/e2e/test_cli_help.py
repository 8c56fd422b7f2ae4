"""Every command's --help reads as plain text: no reST markup, no type shown for a flag."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer
from typer.testing import CliRunner

from uprof.cli.main import app


def _commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command path under a group (Typer's groups: anything with ``commands``)."""
    yield path
    for name, command in sorted(group.commands.items()):
        if hasattr(command, "commands"):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name)


def test_every_help_page_is_plain_text() -> None:
    root = typer.main.get_command(app)
    paths = list(_commands(root))
    assert len(paths) > 40  # every command of the CLI was walked, not only the root
    marked = []
    for path in paths:
        result = CliRunner().invoke(app, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        if "``" in result.output or "<bool>" in result.output:
            marked.append(" ".join(path) or "uprof")
    assert marked == []


def test_bench_comes_from_the_benchmarks_entry_point() -> None:
    """The product does not import benchmarks/: `uprof bench` is added through the
    ``uprof.cli`` entry point group, and still answers as documented."""
    from importlib.metadata import entry_points

    from uprof.cli.main import PLUGIN_GROUP

    (bench,) = [e for e in entry_points(group=PLUGIN_GROUP) if e.name == "bench"]
    assert bench.value == "benchmarks.cli:register"
    result = CliRunner().invoke(app, ["bench", "reliability", "--help"])
    assert result.exit_code == 0, result.output
    assert "Crash, concurrency" in result.output
