"""A short soak: mixed captures, slices, consent changes and erasures on SQLite.

A few seconds here (``UPROF_SOAK_SECONDS``); the 10-minute run is the reliability bench.
"""

from __future__ import annotations

import os

import pytest

from benchmarks.reliability import Target, soak_scenario

SECONDS = float(os.environ.get("UPROF_SOAK_SECONDS", "6"))
#: Generous: the 10-minute run grows far less (docs/reliability.md).
RSS_GROWTH_BOUND_KIB = 300 * 1024


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_short_soak_has_no_unexpected_error_and_bounded_memory(target: Target) -> None:
    r = soak_scenario(target, seconds=SECONDS, sample_every=2.0)
    assert r["unexpected_errors"] == 0, r["error_samples"]
    assert set(r["operations"]) >= {"capture", "slice", "consent"}
    assert len(r["rss_kib_samples"]) >= 3 and r["rss_kib_first"] > 0
    assert r["rss_growth_kib_after_warmup"] < RSS_GROWTH_BOUND_KIB
    assert r["rebuild_equals_live"]
