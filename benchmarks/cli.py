"""``uprof bench ...``: the benchmarks in benchmarks/, runnable from the CLI.

The product never imports benchmarks/ (an import-linter contract in pyproject.toml).
This module adds itself to the ``uprof`` command through the entry point group
``uprof.cli`` (``register`` below, named in pyproject.toml), which the CLI reads when
it starts; an install without benchmarks/ simply has no ``uprof bench``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from uprof.cli.context import CheckedTyper, console

bench_app = CheckedTyper(no_args_is_help=True, help="Run benchmarks; results go to docs/.")


@bench_app.command("kernel")
def bench_kernel(
    backend: Annotated[str, typer.Option(help="sqlite or postgres")] = "sqlite",
    out: Annotated[Path | None, typer.Option(help="JSON result file.")] = None,
    quick: Annotated[bool, typer.Option(help="Small sizes, one repetition (smoke run).")] = False,
    embedder: Annotated[
        str, typer.Option(help="minilm or hashing for the pipeline figure.")
    ] = "minilm",
    parts: Annotated[
        str, typer.Option(help="Comma list of capture, pipeline, rebuild.")
    ] = "capture,pipeline,rebuild",
    torch_threads: Annotated[int, typer.Option(help="torch intra-op threads (0: default).")] = 1,
) -> None:
    """Capture throughput and latency, extraction + projection, full rebuild."""
    from benchmarks import kernel_bench
    from benchmarks.baselines import set_torch_threads

    # One thread: on a shared 2-core machine torch's default of one per core contends.
    set_torch_threads(torch_threads or None)
    if backend not in ("sqlite", "postgres"):
        raise typer.BadParameter("backend must be sqlite or postgres")
    target = out or Path(f"docs/bench/kernel-{backend}.json")
    chosen = tuple(p for p in _systems(parts) if p in kernel_bench.PARTS)
    kernel_bench.main(backend, target, quick, embedder, echo=console.print, parts=chosen)


def _systems(names: str) -> list[str]:
    return [n.strip() for n in names.split(",") if n.strip()]


def _factories(
    systems: str, torch_threads: int, baselines: Callable[[list[str]], dict[str, Any]]
) -> dict[str, Any]:
    """Baselines and uprof variants by name, in the order given.

    ``baselines`` is the benchmark's own builder (``benchmarks.locomo.default_systems``
    or ``benchmarks.prefeval.default_systems``), so the CLI renders baseline
    candidates exactly as the benchmark module, its tests and the SPEC do. The one
    torch thread count goes to every system, baselines and uprof alike.
    """
    from benchmarks.baselines import set_torch_threads
    from benchmarks.uprof_system import UPROF_SYSTEMS

    set_torch_threads(torch_threads or None)
    names = _systems(systems)
    built = baselines([n for n in names if n not in UPROF_SYSTEMS])
    return {
        n: partial(UPROF_SYSTEMS[n], torch_threads) if n in UPROF_SYSTEMS else built[n]
        for n in names
    }


@bench_app.command("locomo")
def bench_locomo(
    data: Annotated[Path, typer.Option(help="locomo10-format JSON (read in place).")] = Path(
        "../shared/bench/data/locomo_dev.json"
    ),
    out: Annotated[Path, typer.Option(help="Results JSON.")] = Path("docs/bench/er-at-budget.json"),
    systems: Annotated[
        str, typer.Option(help="Comma list: uprof, uprof-lexical and baselines.")
    ] = "recency,bm25,tfidf,embedding,hybrid-rrf,oracle,uprof",
    budgets: Annotated[str, typer.Option(help="Comma list of budgets.")] = "256,512,1024,2048,4096",
    modes: Annotated[str, typer.Option(help="S, P-routed, P-both.")] = "S",
    markdown: Annotated[Path, typer.Option(help="Markdown to update.")] = Path(
        "docs/benchmarks.md"
    ),
    conversations: Annotated[str | None, typer.Option(help="Sample ids subset.")] = None,
    torch_threads: Annotated[int, typer.Option(help="torch intra-op threads.")] = 1,
) -> None:
    """LoCoMo evidence recall at a token budget (SPEC §1), uprof beside the baselines."""
    from benchmarks.locomo import default_systems, load_locomo, run_locomo

    sample_ids = _systems(conversations) if conversations else None
    convs = load_locomo(data, None, sample_ids=sample_ids)
    factories = _factories(systems, torch_threads, lambda names: default_systems(names, convs))
    run_locomo(
        data,
        out,
        systems=factories,
        budgets=[int(b) for b in budgets.split(",")],
        modes=_systems(modes),
        markdown_path=markdown,
        sample_ids=sample_ids,
        progress=console.print,
    )
    console.print(f"results in {out}, table in {markdown}")


@bench_app.command("prefeval")
def bench_prefeval(
    data: Annotated[Path, typer.Option(help="Folder of PrefEval topic files.")] = Path(
        "../shared/bench/data/prefeval/explicit_preference"
    ),
    out: Annotated[Path, typer.Option(help="Results JSON.")] = Path("docs/bench/pr-at-budget.json"),
    systems: Annotated[
        str, typer.Option(help="Comma list: uprof, uprof-lexical and baselines.")
    ] = "bm25,embedding,hybrid-rrf,uprof",
    distractors: Annotated[str, typer.Option(help="Comma list of N.")] = "10,50,200",
    budgets: Annotated[str, typer.Option(help="Comma list of budgets.")] = "128,256,512",
    topics: Annotated[str | None, typer.Option(help="Topic subset (file stems).")] = None,
    markdown: Annotated[Path, typer.Option(help="Markdown to update.")] = Path(
        "docs/benchmarks.md"
    ),
    torch_threads: Annotated[int, typer.Option(help="torch intra-op threads.")] = 1,
) -> None:
    """PrefEval preference recall under distractors (SPEC §2), uprof beside the baselines."""
    from benchmarks.prefeval import default_systems, load_prefeval, run_prefeval

    chosen_topics = _systems(topics) if topics else None
    items = load_prefeval(data, chosen_topics)
    factories = _factories(systems, torch_threads, lambda names: default_systems(names, items))
    run_prefeval(
        data,
        out,
        systems=factories,
        markdown_path=markdown,
        progress=console.print,
        distractor_counts=[int(n) for n in distractors.split(",")],
        budgets=[int(b) for b in budgets.split(",")],
        topics=chosen_topics,
    )
    console.print(f"results in {out}, table in {markdown}")


@bench_app.command("slice")
def bench_slice(
    memories: Annotated[int, typer.Option(help="Memories in the subject.")] = 5_000,
    queries: Annotated[int, typer.Option(help="Slices per mode.")] = 200,
    out: Annotated[Path, typer.Option(help="Results JSON.")] = Path(
        "docs/bench/slice-real-turns.json"
    ),
    torch_threads: Annotated[int, typer.Option(help="torch intra-op threads.")] = 1,
    runs: Annotated[int, typer.Option(help="Rounds; each figure is their median.")] = 3,
    data: Annotated[Path, typer.Option(help="Bench data folder (locomo_dev.json).")] = Path(
        "../shared/bench/data"
    ),
    seeded: Annotated[
        Path | None,
        typer.Option(help="Keep the captured subject here; reuse it when already seeded."),
    ] = None,
    dump_contents: Annotated[
        Path | None,
        typer.Option(help="Write each question's slice items here (0 runs: only that)."),
    ] = None,
) -> None:
    """Slice latency on LoCoMo dev turns (hybrid, lexical-only, baselines) at B=1024."""
    from benchmarks import slice_bench
    from benchmarks.baselines import set_torch_threads

    set_torch_threads(torch_threads or None)
    slice_bench.main(
        out,
        memories,
        queries,
        echo=console.print,
        runs=runs,
        data_dir=data,
        seeded=seeded,
        dump_contents=dump_contents,
    )


@bench_app.command("governance")
def bench_governance(
    backend: Annotated[str, typer.Option(help="sqlite or postgres")] = "sqlite",
    events: Annotated[int, typer.Option(help="Captured events per erased subject.")] = 10_000,
    subjects: Annotated[int, typer.Option(help="Subjects to erase.")] = 3,
    out: Annotated[Path | None, typer.Option(help="Results JSON.")] = None,
) -> None:
    """Erasure time and residue for large subjects; audit overhead on slices."""
    from benchmarks import governance_bench

    target = out or Path(f"docs/bench/governance-{backend}.json")
    governance_bench.main(backend, target, events, subjects, echo=console.print)


@bench_app.command("memory")
def bench_memory(
    subjects: Annotated[int, typer.Option(help="Subjects seeded, then sliced once each.")] = 10_000,
    captures: Annotated[int, typer.Option(help="Captured turns per subject.")] = 20,
    clients: Annotated[int, typer.Option(help="Concurrent REST clients.")] = 4,
    every: Annotated[int, typer.Option(help="Sample the server's RSS every N subjects.")] = 1_000,
    out: Annotated[Path, typer.Option(help="Results JSON.")] = Path("docs/bench/memory.json"),
    quick: Annotated[bool, typer.Option(help="2,000 subjects x 5 captures (smoke run).")] = False,
) -> None:
    """Server RSS while slicing many subjects over REST: flat once the caches are full."""
    from benchmarks import memory_bench

    if quick:
        subjects, captures, every = 2_000, 5, 500
    memory_bench.main(out, subjects, captures, clients, every, echo=console.print)


@bench_app.command("pipeline")
def bench_pipeline(
    backend: Annotated[
        list[str] | None, typer.Option("--backend", help="sqlite or postgres; repeatable.")
    ] = None,
    workers: Annotated[
        list[int] | None, typer.Option("--workers", help="Worker processes; repeatable.")
    ] = None,
    conversations: Annotated[int, typer.Option(help="LoCoMo dev conversations to ingest.")] = 2,
    repeat: Annotated[int, typer.Option(help="Runs per configuration (median).")] = 3,
    turns_per_subject: Annotated[int, typer.Option(help="Turns per speaker (0: all).")] = 0,
    compare_tree: Annotated[
        Path | None,
        typer.Option(help="Checkout of older code; its runs alternate with this code's."),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="JSON result file.")] = None,
) -> None:
    """Extraction + projection per worker process on LoCoMo turns with MiniLM."""
    from benchmarks.pipeline_bench import main

    argv = ["--conversations", str(conversations), "--repeat", str(repeat)]
    argv += ["--turns-per-subject", str(turns_per_subject)]
    if compare_tree is not None:
        argv += ["--compare-tree", str(compare_tree)]
    for kind in backend or []:
        if kind not in ("sqlite", "postgres"):
            raise typer.BadParameter("backend must be sqlite or postgres")
        argv += ["--backend", kind]
    for w in workers or []:
        argv += ["--workers", str(w)]
    if out is not None:
        argv += ["--out", str(out)]
    raise typer.Exit(main(argv))


@bench_app.command("attributes")
def bench_attributes(
    split: Annotated[str, typer.Option(help="train (development) or test (the figure).")] = "train",
    data: Annotated[Path, typer.Option(help="msc_personas_all.json (read in place).")] = Path(
        "../shared/bench/data/msc_personas_all.json"
    ),
    out: Annotated[Path | None, typer.Option(help="Results JSON.")] = None,
    errors: Annotated[bool, typer.Option(help="List every missed and wrong attribute.")] = False,
    llm: Annotated[bool, typer.Option(help="Also score the configured LLM extractor.")] = True,
    speakers: Annotated[
        Path | None, typer.Option(help="Instead: count whose turns attributes come from (LoCoMo).")
    ] = None,
) -> None:
    """Attribute precision and recall per category on hand-labelled MSC persona sentences."""
    from benchmarks.attribute_pr import run, speaker_attribution

    if speakers is not None:
        speaker_attribution(speakers, echo=console.print)
        return
    if split not in ("train", "test"):
        raise typer.BadParameter("split must be train or test")
    target = out or Path(f"docs/bench/attributes-{split}.json")
    run(split, data=data, out=target, with_llm=llm, show_errors=errors, echo=console.print)
    console.print(f"results in {target}")


@bench_app.command("fidelity")
def bench_fidelity(
    locomo: Annotated[Path, typer.Option(help="locomo10-format JSON (read in place).")] = Path(
        "../shared/bench/data/locomo_dev.json"
    ),
    personas: Annotated[Path, typer.Option(help="msc_personas_all.json (read in place).")] = Path(
        "../shared/bench/data/msc_personas_all.json"
    ),
    parts: Annotated[
        str, typer.Option(help="Comma list of provenance, personas, table2.")
    ] = "provenance,personas,table2",
    splits: Annotated[str, typer.Option(help="Persona splits (train tunes, test gates).")] = "test",
    pairs: Annotated[int | None, typer.Option(help="First N persona pairs per split.")] = None,
    conversations: Annotated[str | None, typer.Option(help="LoCoMo sample ids subset.")] = None,
    systems: Annotated[str, typer.Option(help="Table 2 methods.")] = "uprof,bm25,embedding",
    budgets: Annotated[str, typer.Option(help="Table 2 budget sweep.")] = (
        "256,512,1024,2048,4096"
    ),
    deletions: Annotated[int, typer.Option(help="Deleted questions per conversation.")] = 10,
    out: Annotated[Path, typer.Option(help="Results JSON.")] = Path("docs/bench/fidelity.json"),
    markdown: Annotated[Path, typer.Option(help="Markdown to update.")] = Path(
        "docs/benchmarks.md"
    ),
    torch_threads: Annotated[int, typer.Option(help="torch intra-op threads.")] = 1,
) -> None:
    """Profile fidelity and isolation (SPEC §3) and the seeds' table 2 on LoCoMo."""
    import sys

    from benchmarks import fidelity_bench
    from benchmarks.baselines import set_torch_threads

    set_torch_threads(torch_threads or None)
    report = fidelity_bench.main(
        locomo=locomo,
        personas=personas,
        parts=_systems(parts),
        splits=_systems(splits),
        pairs=pairs,
        conversations=_systems(conversations) if conversations else None,
        systems=_systems(systems),
        budgets=[int(b) for b in budgets.split(",")],
        deletions=deletions,
        out=out,
        markdown_path=markdown,
        command="uprof bench fidelity " + " ".join(sys.argv[3:]),
        echo=console.print,
    )
    console.print(f"results in {out}, tables in {markdown}")
    failed = fidelity_bench.gate_failures(report)
    for problem in failed:
        console.print(f"[bold red]gate failed:[/] {problem}")
    if failed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``bench`` (with ``bench reliability``) to the ``uprof`` command."""
    from benchmarks import reliability_cli

    reliability_cli.register(bench_app)
    app.add_typer(bench_app, name="bench")
