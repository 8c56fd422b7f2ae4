"""``uprof bench reliability ...``: the long reliability and security runs.

Mounted under ``uprof bench`` by ``benchmarks/cli.py`` (adds the ``reliability`` sub-app).
Every command forwards to ``benchmarks.reliability.main`` and so writes
``docs/bench/reliability.json``; see docs/reliability.md for the figures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from uprof.cli.context import CheckedTyper

reliability_app = CheckedTyper(
    no_args_is_help=True, help="Crash, concurrency, leakage, erasure, tamper, fuzz and soak runs."
)

SCENARIOS = ("crash", "concurrency", "leakage", "erasure", "tamper", "fuzz", "soak")


@reliability_app.command("run")
def run(
    only: Annotated[
        list[str] | None, typer.Option("--only", help=f"One of {', '.join(SCENARIOS)}; repeatable.")
    ] = None,
    backend: Annotated[
        list[str] | None, typer.Option("--backend", help="sqlite or postgres; repeatable.")
    ] = None,
    crash_kills: Annotated[int, typer.Option(help="SIGKILLs of a capturing child.")] = 50,
    process_kills: Annotated[int, typer.Option(help="SIGKILLs of a child in process().")] = 10,
    writes_per_thread: Annotated[int, typer.Option(help="Captures per writer thread.")] = 100,
    slices: Annotated[int, typer.Option(help="Slice requests in the leakage run.")] = 100_000,
    tamper_trials: Annotated[int, typer.Option(help="Random edits of trail and receipt.")] = 5_000,
    fuzz_files: Annotated[int, typer.Option(help="Random JSONL files for the importer.")] = 3_000,
    soak_seconds: Annotated[float, typer.Option(help="Soak duration in seconds.")] = 600.0,
    out: Annotated[Path | None, typer.Option(help="JSON output file.")] = None,
) -> None:
    """Run the long versions (all scenarios, both backends, unless narrowed)."""
    from benchmarks.reliability import main

    argv: list[str] = []
    for name in only or []:
        if name not in SCENARIOS:
            raise typer.BadParameter(f"unknown scenario {name!r}", param_hint="--only")
        argv += ["--only", name]
    for kind in backend or []:
        argv += ["--backend", kind]
    argv += [
        "--crash-kills",
        str(crash_kills),
        "--process-kills",
        str(process_kills),
        "--writes-per-thread",
        str(writes_per_thread),
        "--slices",
        str(slices),
        "--tamper-trials",
        str(tamper_trials),
        "--fuzz-files",
        str(fuzz_files),
        "--soak-seconds",
        str(soak_seconds),
    ]
    if out is not None:
        argv += ["--out", str(out)]
    raise typer.Exit(main(argv))


@reliability_app.command("workers")
def workers(
    backend: Annotated[
        list[str] | None, typer.Option("--backend", help="sqlite or postgres; repeatable.")
    ] = None,
    runs: Annotated[int, typer.Option(help="Fresh databases per backend.")] = 20,
    seconds: Annotated[float, typer.Option(help="REST load per run, in seconds.")] = 20.0,
    partitions: Annotated[int, typer.Option(help="Pipeline partitions (1: all race).")] = 2,
    out: Annotated[Path | None, typer.Option(help="JSON output file.")] = None,
) -> None:
    """2 servers + 3 workers, 8 REST clients, random SIGKILLs of workers: count duplicate
    and missing extractions, lost captures and rebuild-equals-live per run (exit 1 if any
    run was not exact). Writes docs/bench/workers.json."""
    from benchmarks.workers_bench import main as workers_main

    argv = ["--runs", str(runs), "--seconds", str(seconds), "--partitions", str(partitions)]
    for kind in backend or []:
        if kind not in ("sqlite", "postgres"):
            raise typer.BadParameter(f"unknown backend {kind!r}", param_hint="--backend")
        argv += ["--backend", kind]
    if out is not None:
        argv += ["--out", str(out)]
    raise typer.Exit(workers_main(argv))


def register(app: typer.Typer) -> None:
    """Add ``reliability`` under ``app`` (meant for the ``bench`` sub-app)."""
    app.add_typer(reliability_app, name="reliability")
