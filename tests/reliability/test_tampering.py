"""I10 end to end: the kernel's own audit export and an erasure receipt, randomly edited.

The thorough mutation suites live in tests/audit (test_export.py, test_receipts.py).
"""

from __future__ import annotations

import pytest

from benchmarks.reliability import Target, tamper_scenario


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_every_edit_of_the_kernels_trail_and_receipt_is_detected(target: Target) -> None:
    r = tamper_scenario(target, trials=150)
    assert r["entries_in_export"] > 5
    assert r["export_mutations_detected"] > 100
    assert r["receipt_mutations_detected"] > 100
    assert r["undetected"] == 0, r["undetected_samples"]
