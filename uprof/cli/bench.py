"""``uprof bench ...``: the benchmarks in benchmarks/, runnable from the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from uprof.cli.context import console

bench_app = typer.Typer(no_args_is_help=True, help="Run benchmarks; results go to docs/.")


@bench_app.command("kernel")
def bench_kernel(
    backend: Annotated[str, typer.Option(help="sqlite or postgres")] = "sqlite",
    out: Annotated[Path | None, typer.Option(help="JSON result file.")] = None,
    quick: Annotated[bool, typer.Option(help="Small sizes, one repetition (smoke run).")] = False,
    embedder: Annotated[
        str, typer.Option(help="minilm or hashing for the pipeline figure.")
    ] = "minilm",
) -> None:
    """Capture throughput and latency, extraction + projection, full rebuild."""
    from benchmarks import kernel_bench

    if backend not in ("sqlite", "postgres"):
        raise typer.BadParameter("backend must be sqlite or postgres")
    target = out or Path(f"docs/bench/kernel-{backend}.json")
    kernel_bench.main(backend, target, quick, embedder, echo=console.print)
