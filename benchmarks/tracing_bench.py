"""What tracing costs a slice: off, on, and (with ``--baseline``) the code before tracing.

Run: ``python -m benchmarks.tracing_bench [--memories 300] [--slices 100] [--rounds 5]
[--processes 3] [--backend sqlite|postgres] [--baseline PATH]``.

One subject with ``memories`` captures (the kernel benchmark's sentences, the hashing
embedder: a slice without the model's ~10 ms query embedding, so span costs weigh more,
not less, than in a served slice), caught up; then rounds of ``slices`` kernel slices
(B=1024, queries cycling) in each mode, the modes alternating round by round in one
process:

- ``off``: no exporter (the default);
- ``on-batch``: the production set-up, a ``BatchSpanProcessor``, with an exporter that
  drops what it is given (what an exporter then does with the spans, serialising and
  sending them, happens on the processor's thread and is not in these figures);
- ``on-memory``: the tests' set-up, a ``SimpleSpanProcessor`` into the SDK's in-memory
  exporter (cleared after each round).

With ``--baseline PATH`` (a checkout of the commit before tracing, e.g. a ``git worktree``)
the same runs go to a process in that tree too, in ``off`` mode only, processes
alternating between the trees ``processes`` times. Also a micro-benchmark of one span.
Prints JSON: per process and mode the median over rounds of the per-round p50 and p95
(ms) and the CPU seconds per slice of the process; then the medians over processes and
the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
QUERIES = (
    "what do I like to eat?",
    "where did I travel last year?",
    "what are my plans for the weekend?",
    "which sports do I do?",
    "what music do I listen to?",
    "who are my friends?",
)


def _has_tracing() -> bool:
    # Whether *this* tree has the module: an editable install elsewhere would otherwise
    # lend its uprof.telemetry to a baseline checkout that predates it.
    import uprof

    return (Path(uprof.__file__).parent / "telemetry.py").exists()


def _providers() -> dict[str, Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    class Discard(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    batch = TracerProvider()
    batch.add_span_processor(BatchSpanProcessor(Discard()))
    memory_exporter = InMemorySpanExporter()
    memory = TracerProvider()
    memory.add_span_processor(SimpleSpanProcessor(memory_exporter))
    return {"off": None, "on-batch": batch, "on-memory": memory, "_memory": memory_exporter}


def _span_micro(providers: dict[str, Any]) -> dict[str, float]:
    """Nanoseconds per ``with telemetry.span(...)`` with two attributes."""
    from uprof import telemetry

    out = {}
    n = 2_000  # below the batch queue (2,048): a full queue drops spans and warns
    for mode in ("off", "on-batch"):
        telemetry.trace_with(providers[mode])
        began = time.perf_counter()
        for i in range(n):
            with telemetry.span("uprof.bench", items=i, purpose="personalization"):
                pass
        out[mode] = round((time.perf_counter() - began) / n * 1e9, 1)
    telemetry.trace_with(None)
    return out


def child(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.kernel_bench import APP, capture_batched, deployment, grant

    tracing = _has_tracing()
    modes = ["off", "on-batch", "on-memory"] if tracing else ["off"]
    providers: dict[str, Any] = _providers() if tracing else {"off": None}
    samples: dict[str, list[list[float]]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    with deployment(args.backend) as k:
        grant(k, "alice")
        capture_batched(k, "alice", args.memories, 50)
        k.process()
        now = datetime(2025, 2, 1, tzinfo=UTC)

        def one(i: int) -> None:
            k.slice(
                "alice",
                QUERIES[i % len(QUERIES)],
                budget_tokens=1024,
                purpose="personalization",
                app_id=APP,
                agent_id="agent:bench",
                now=now,
            )

        for i in range(20):  # warm the subject's cached view and the vector cache
            one(i)
        for _ in range(args.rounds):
            for mode in modes:
                if tracing:
                    from uprof import telemetry

                    telemetry.trace_with(providers[mode])
                latencies = []
                cpu_began = time.process_time()
                for i in range(args.slices):
                    began = time.perf_counter()
                    one(i)
                    latencies.append((time.perf_counter() - began) * 1000)
                cpu[mode].append((time.process_time() - cpu_began) / args.slices)
                samples[mode].append(latencies)
                if mode == "on-memory":
                    providers["_memory"].clear()
        if tracing:
            from uprof import telemetry

            telemetry.trace_with(None)
        k.reads.drain()
    result: dict[str, Any] = {"tracing_code": tracing}
    for mode in modes:
        p50s = [statistics.median(r) for r in samples[mode]]
        p95s = [statistics.quantiles(r, n=20)[18] for r in samples[mode]]
        result[mode] = {
            "p50_ms": round(statistics.median(p50s), 3),
            "p95_ms": round(statistics.median(p95s), 3),
            "p50_per_round_ms": [round(x, 3) for x in p50s],
            "cpu_ms_per_slice": round(statistics.median(cpu[mode]) * 1000, 3),
        }
    if tracing:
        result["span_ns"] = _span_micro(providers)
    return result


def _spawn(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run the child in ``tree`` (its own uprof first on the path)."""
    argv = [
        "--child",
        "--memories",
        str(args.memories),
        "--slices",
        str(args.slices),
        "--rounds",
        str(args.rounds),
        "--backend",
        args.backend,
    ]
    code = (
        f"import runpy, sys; sys.argv = ['tracing_bench', *{argv!r}]; "
        f"runpy.run_path({str(HERE)!r}, run_name='__main__')"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPROF_")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tree,
        env={**env, "HF_HUB_OFFLINE": "1"},
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--memories", type=int, default=300)
    parser.add_argument("--slices", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--baseline", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    trees = {"this": HERE.parent.parent}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for _ in range(args.processes):
        for name, tree in trees.items():
            runs[name].append(_spawn(tree, args))
    summary: dict[str, Any] = {}
    for name, results in runs.items():
        for mode in ("off", "on-batch", "on-memory"):
            if mode in results[0]:
                summary[f"{name}.{mode}"] = {
                    key: round(statistics.median(r[mode][key] for r in results), 3)
                    for key in ("p50_ms", "p95_ms", "cpu_ms_per_slice")
                }
    print(
        json.dumps(
            {
                "memories": args.memories,
                "slices_per_round": args.slices,
                "rounds": args.rounds,
                "backend": args.backend,
                "load_average_before": [round(x, 2) for x in load_before],
                "load_average_after": [round(x, 2) for x in os.getloadavg()],
                "summary": summary,
                "processes": runs,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
