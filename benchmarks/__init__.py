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

The names below load with their first use (PEP 562): ``uprof bench`` is added to every
``uprof`` command line, and its import of this package loaded the token counter's
library for ``uprof --help`` too (0249-cli-start-cost).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("benchmarks.bench_common"), name)
    globals()[name] = value  # asked once
    return value
