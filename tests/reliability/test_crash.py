"""I12 / I11 under SIGKILL: a capture child and a process() child killed at random points."""

from __future__ import annotations

from benchmarks.reliability import Target, child_args, crash_scenario
from tests.children import PythonChild

VICTIM = "import sys\nfrom benchmarks.reliability import _child\nsys.exit(_child(sys.argv[1:]))\n"


def forked_victim(target: Target, mode: str, seed: int) -> PythonChild:
    """The scenario's victim (``python -m benchmarks.reliability --child ...``) forked from
    the tests' fork server: a process of its own, SIGKILLed as before, without paying the
    project's imports again (~1 s each, 4 victims a run; decision 0061)."""
    return PythonChild(VICTIM, *child_args(target, mode, seed), stream_stdout=True)


def test_sigkill_loses_and_duplicates_nothing_and_projections_converge(target: Target) -> None:
    r = crash_scenario(target, kills=3, process_kills=1, seed=42, spawn=forked_victim)
    assert r["children_killed_by_sigkill"] == 3
    # The process() child died mid-run (after a committed batch, before it finished).
    assert r["process_runs_interrupted_before_done"] == 1
    assert r["acked"] > 0, "the children acknowledged nothing: the test would be vacuous"
    assert r["acked_unique"] == r["acked"]
    assert r["lost"] == 0
    assert r["duplicated"] == 0
    assert r["audit_integrity_ok"]
    assert r["rebuild_equals_live"]
