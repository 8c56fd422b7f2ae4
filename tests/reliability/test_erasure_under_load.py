"""I9 under load: subjects erased while captures and slices run in other threads."""

from __future__ import annotations

from benchmarks.reliability import Target, erasure_scenario


def test_erasure_under_load_leaves_no_residue(target: Target) -> None:
    r = erasure_scenario(target, erased=3, writers=2, readers=2, seconds=3.0)
    assert r["receipts_verified"] == 3
    assert r["residue_findings"] == 0
    assert r["streams_checked"] == 3
    assert r["unexpected_errors"] == 0, r["error_samples"]
    assert r["concurrent_captures"] > 0 and r["concurrent_slices"] > 0
    assert r["concurrent_captures_lost"] == 0
    assert r["bystanders_unchanged"], r["bystander_tables_changed"]
    assert r["rebuild_equals_live"]
