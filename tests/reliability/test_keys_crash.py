"""SIGKILL during erasure, backup and restore: nothing acknowledged lost, nothing erased
readable (one round per backend; ``python -m benchmarks.keys_reliability`` runs 20)."""

from __future__ import annotations

from benchmarks.keys_reliability import keys_crash_scenario
from benchmarks.reliability import Target


def test_sigkill_in_erasure_backup_and_restore_loses_and_resurrects_nothing(
    target: Target,
) -> None:
    r = keys_crash_scenario(target, runs=1, seed=3)
    assert r["violations"] == []
    assert r["backup_complete"] + r["backup_absent"] == 1
    assert r["erase_acked"] + r["erase_finished_by_retry"] + r["erase_finished_by_start"] == 1
