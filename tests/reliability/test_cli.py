"""The ``reliability`` Typer sub-app forwards its options to benchmarks.reliability.main."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

import benchmarks.reliability as bench
from benchmarks import reliability_cli as reliability


def test_register_adds_a_run_command_that_forwards(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(bench, "main", lambda argv: calls.append(list(argv)) or 0)
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    reliability.register(app)
    args = ["reliability", "run", "--only", "tamper", "--backend", "sqlite", "--tamper-trials", "9"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (argv,) = calls
    assert argv[:4] == ["--only", "tamper", "--backend", "sqlite"]
    assert argv[argv.index("--tamper-trials") + 1] == "9"
    bad = CliRunner().invoke(app, ["reliability", "run", "--only", "nope"])
    assert bad.exit_code != 0


def test_benchmark_main_rejects_unknown_scenarios() -> None:
    with pytest.raises(SystemExit):
        bench.main(["--only", "nope"])


def test_the_workers_command_forwards_to_the_workers_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    import benchmarks.workers_bench as workers_bench

    calls: list[list[str]] = []
    monkeypatch.setattr(workers_bench, "main", lambda argv: calls.append(list(argv)) or 0)
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    reliability.register(app)
    args = ["reliability", "workers", "--backend", "postgres", "--runs", "3", "--seconds", "5"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (argv,) = calls
    assert argv[argv.index("--runs") + 1] == "3"
    assert argv[argv.index("--backend") + 1] == "postgres"
    bad = CliRunner().invoke(app, ["reliability", "workers", "--backend", "mysql"])
    assert bad.exit_code != 0
