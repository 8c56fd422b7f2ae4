"""CPU time per slice on a seeded bench subject, to compare two versions of the code.

Wall times on the shared 2-core machine swing with other jobs; the CPU time of the
serving thread (``time.thread_time``) moves far less, so it is what this script
compares. Usage, once per code tree (decision 0041-slice-latency-round-2)::

    cp -a SEEDED /tmp/copy   # a copy: served slices count as visits
    PYTHONPATH=<tree> HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.slice_cpu \\
        /tmp/copy 60 3 out.json [--profile]

``SEEDED`` is a folder seeded by ``uprof bench slice --seeded``. Per round and mode
the p50 over the questions of: ``retrieval_only`` (a hybrid slice whose query vector is
precomputed: everything but embedding the question), ``lexical`` (a lexical-only slice)
and ``embed`` (embedding the question alone, through the deployment's embedder); each
also as ``<mode>_process_cpu`` (every thread of the process: the bridges' product runs
half on a helper thread from 4,096 memories up) and ``<mode>_wall``. With
``--profile``, a cProfile of one more pass of retrieval-only slices goes to out.json.prof.
Not run in the test suite or CI.
"""

from __future__ import annotations

import cProfile
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import slice_bench as sb


def main(argv: Sequence[str]) -> dict[str, Any]:
    args = sb.SeededRun.from_argv(argv)
    profile = "--profile" in argv[4:]
    seeded, questions, rounds, out = args.seeded, args.questions, args.rounds, args.out
    result = args.header()
    with sb._seeded_deployment(seeded) as k:
        k.process()
        real = k.slice_service._embedder
        precomputed = sb.PrecomputedEmbedder(real, questions)

        def retrieval_only(question: str) -> None:
            k.slice_service._embedder = precomputed
            try:
                sb.serve_bench_slice(k, question)
            finally:
                k.slice_service._embedder = real

        modes: dict[str, Callable[[str], object]] = {
            "retrieval_only": retrieval_only,
            "lexical": lambda q: sb.serve_bench_slice(k, q, lexical=True),
            "embed": lambda q: real.embed([q]),
        }
        for question in questions[:3]:  # warm-up: builds the views
            sb.serve_bench_slice(k, question)
            sb.serve_bench_slice(k, question, lexical=True)
        # The serving thread's CPU; the whole process's CPU, which also counts the helper
        # thread's half of a large bridges product (decision 0042); and wall time.
        clocks = {
            "": time.thread_time,
            "_process_cpu": time.process_time,
            "_wall": time.perf_counter,
        }
        per_round: dict[str, list[float]] = {name + c: [] for name in modes for c in clocks}
        for _ in range(rounds):
            for name, run in modes.items():
                timings: dict[str, list[float]] = {c: [] for c in clocks}
                for question in questions:
                    began = {c: clock() for c, clock in clocks.items()}
                    run(question)
                    for c, clock in clocks.items():
                        timings[c].append((clock() - began[c]) * 1000)
                for c, values in timings.items():
                    per_round[name + c].append(round(statistics.median(values), 2))
            k.reads.drain()
        if profile:
            profiler = cProfile.Profile()
            profiler.enable()
            for question in questions:
                retrieval_only(question)
            profiler.disable()
            profiler.dump_stats(f"{out}.prof")
    for name, values in per_round.items():
        result[name] = {"cpu_p50_ms_per_round": values, "median": statistics.median(values)}
    return sb.write_result(out, result)


if __name__ == "__main__":
    main(sys.argv[1:])
