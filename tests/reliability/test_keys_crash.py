"""SIGKILL during erasure, backup and restore: nothing acknowledged lost, nothing erased
readable (one round per backend; ``python -m benchmarks.keys_reliability`` runs 20)."""

from __future__ import annotations

from benchmarks.keys_reliability import keys_crash_scenario
from benchmarks.reliability import Target
from tests.children import PythonChild

VICTIM = (
    "import sys\nfrom benchmarks.keys_reliability import _child\nsys.exit(_child(sys.argv[1:]))\n"
)


def forked_victim(args: list[str]) -> PythonChild:
    """The scenario's victim (``python -m benchmarks.keys_reliability --child ...``) forked
    from the tests' fork server: a process of its own in a process group of its own,
    SIGKILLed with its pg_dump / pg_restore as before, without paying the project's imports
    again (~1 s each, 3 victims a run; decision 0061)."""
    return PythonChild(VICTIM, *args, stream_stdout=True, new_session=True)


def test_sigkill_in_erasure_backup_and_restore_loses_and_resurrects_nothing(
    target: Target,
) -> None:
    r = keys_crash_scenario(target, runs=1, seed=3, spawn=forked_victim)
    assert r["violations"] == []
    assert r["backup_complete"] + r["backup_absent"] == 1
    assert r["erase_acked"] + r["erase_finished_by_retry"] + r["erase_done_answer_lost"] == 1
