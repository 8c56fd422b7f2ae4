"""LLM-free retrieval-quality benchmarks for profile slices.

The benchmark data is non-commercial and is read at run time from a path given by
the caller (default ``../shared/bench/data`` relative to the repository root); it
is never copied into this package.

Modules:
- :mod:`benchmarks.bench_common`: the system-under-test protocol, the cl100k token
  counter, the turn renderer and the budget packers.
- :mod:`benchmarks.baselines`: recency, BM25, TF-IDF, MiniLM and oracle systems.
- :mod:`benchmarks.locomo`: LoCoMo evidence recall at a token budget (SPEC section 1).
- :mod:`benchmarks.prefeval`: PrefEval preference recall under distractors (section 2).
- :mod:`benchmarks.report`: Markdown tables for both.
"""

from benchmarks.bench_common import (
    BenchSlice,
    BenchSystem,
    BenchTurn,
    Forgetful,
    GoldAware,
    SliceItemRef,
    SystemFactory,
)

__all__ = [
    "BenchSlice",
    "BenchSystem",
    "BenchTurn",
    "Forgetful",
    "GoldAware",
    "SliceItemRef",
    "SystemFactory",
]
