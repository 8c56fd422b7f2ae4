"""The bridges' product, einsum (main before decision 0162-slice-speed) against one-thread
BLAS (that decision), paired in one process on a seeded bench subject.

Wall times on the shared 2-core machine swing with other jobs, so both versions run in
the same process, alternating which goes first, and each figure is a median; the
ratio is the median over questions of the per-question ratio. Two measures:

* ``product``: the product alone, on the subject's own MiniLM vectors tiled to 5,000 and
  20,000 rows, 200 calls each (process CPU, so the helper thread's half counts, and wall);
* ``slices``: whole hybrid slices with the question's vector precomputed (everything but
  embedding the question), each question sliced with each product.

Usage (``SEEDED`` from ``uprof bench slice --seeded``; a copy, served slices are visits)::

    cp -a SEEDED /tmp/copy
    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.bridges_pairs \\
        /tmp/copy 60 3 out.json

Not run in the test suite or CI.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any
from unittest.mock import patch

import numpy as np

from benchmarks import slice_bench as sb
from uprof.retrieval import ranker

Links = Callable[[np.ndarray, np.ndarray], np.ndarray]


def einsum_links(seed_vectors: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """``_seed_links`` as main had it at 01aa464 (einsum, split over the helper thread)."""
    n = len(vectors)
    if n < ranker._SPLIT_LINKS_FROM:
        product: np.ndarray = np.einsum("kj,ij->ki", seed_vectors, vectors)
        return product
    half = n // 2
    links = np.empty((len(seed_vectors), n), dtype=np.result_type(seed_vectors, vectors))
    second = ranker._links_helper.submit(
        np.einsum, "kj,ij->ki", seed_vectors, vectors[half:], out=links[:, half:]
    )
    np.einsum("kj,ij->ki", seed_vectors, vectors[:half], out=links[:, :half])
    if second.cancel():
        np.einsum("kj,ij->ki", seed_vectors, vectors[half:], out=links[:, half:])
    else:
        second.result()
    return links


VARIANTS: dict[str, Links] = {"einsum": einsum_links, "blas": ranker._seed_links}
CLOCKS = {"process_cpu": time.process_time, "wall": time.perf_counter}


def _paired(cases: int, run: Callable[[int, Links], object]) -> dict[str, Any]:
    """Each case run once per variant, alternating which goes first."""
    times: dict[str, dict[str, list[float]]] = {v: {c: [] for c in CLOCKS} for v in VARIANTS}
    for case in range(cases):
        names = list(VARIANTS) if case % 2 == 0 else list(reversed(VARIANTS))
        for name in names:
            began = {c: clock() for c, clock in CLOCKS.items()}
            run(case, VARIANTS[name])
            for c, clock in CLOCKS.items():
                times[name][c].append((clock() - began[c]) * 1000)
    result: dict[str, Any] = {
        name: {c: round(statistics.median(v), 2) for c, v in per.items()}
        for name, per in times.items()
    }
    result["median_ratio_blas_over_einsum"] = {
        c: round(
            statistics.median(
                b / a for a, b in zip(times["einsum"][c], times["blas"][c], strict=True)
            ),
            3,
        )
        for c in CLOCKS
    }
    return result


def _product_of(seeds: list[np.ndarray], memory: np.ndarray) -> Callable[[int, Links], object]:
    return lambda case, links: links(seeds[case], memory)


def main(argv: Sequence[str]) -> dict[str, Any]:
    args = sb.SeededRun.from_argv(argv)
    seeded, questions, rounds, out = args.seeded, args.questions, args.rounds, args.out
    n = len(questions)
    result = args.header()
    with sb._seeded_deployment(seeded) as k:
        k.process()
        k.slice_service._embedder = sb.PrecomputedEmbedder(k.slice_service._embedder, questions)
        for question in questions[:3]:  # warm-up: builds the views and the index
            sb.serve_bench_slice(k, question)

        seen: list[np.ndarray] = []  # the memory vectors the slices' products ran over

        def slice_with(case: int, links: Links) -> None:
            def recording(seed_vectors: np.ndarray, memory: np.ndarray) -> np.ndarray:
                if not seen:
                    seen.append(memory)
                return links(seed_vectors, memory)

            with patch.object(ranker, "_seed_links", recording):
                sb.serve_bench_slice(k, questions[case % n])

        result["slices"] = _paired(n * rounds, slice_with)
        k.reads.drain()
        memory_vectors = seen[0]
    rng = np.random.default_rng(0)
    for rows in (5_000, 20_000):
        tiled = np.ascontiguousarray(np.resize(memory_vectors, (rows, memory_vectors.shape[1])))
        seeds = [tiled[rng.choice(rows, 10, replace=False)] for _ in range(200)]
        result[f"product_{rows}"] = _paired(200, _product_of(seeds, tiled))
    result["memory_rows"] = len(memory_vectors)
    return sb.write_result(out, result)


if __name__ == "__main__":
    main(sys.argv[1:])
