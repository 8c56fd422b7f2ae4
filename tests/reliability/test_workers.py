"""Exactly-once extraction and projection with several worker processes (issue 14).

The small versions of ``benchmarks/workers_bench.py`` (real ``uprof worker``
processes racing on one log, some SIGKILLed), plus the guard itself made to lose a
race on purpose, and read-your-writes with partitions. The full stress (2 servers +
3 workers, 20 runs per backend) is ``uprof bench reliability workers``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from benchmarks.reliability import Target, interaction, line_within, open_kernel
from benchmarks.workers_bench import Child, derived_counts, killed_on_failure, race_scenario
from domain.errors import PositionMovedError
from domain.values import CapturedInteraction, ProposalBatch
from tests.children import forked_popen
from uprof.adapters.extraction import RuleBasedExtractor
from uprof.partitions import PartitioningMismatchError
from uprof.recorders import GuardedTracking


def _assert_exact(r: dict[str, Any]) -> None:
    assert r["captures"] > 0 and r["acked"] == r["captures"], r
    assert r["duplicate"] == 0, r
    assert r["missing"] == 0, r
    assert r["view_duplicate"] == 0 and r["view_missing"] == 0, r
    assert r["view_captures_duplicate"] == 0 and r["view_captures_missing"] == 0, r
    assert r["lost"] == 0, r
    assert r["caught_up"], r
    assert r["rebuild_equals_live"], r


def test_three_workers_on_the_same_positions_extract_and_project_each_capture_once(
    target: Target,
) -> None:
    r = race_scenario(
        target, partitions=1, spec=(None, None, None), seconds=3.0, launch=forked_popen
    )
    _assert_exact(r)
    assert r["exit_codes"] == [0, 0, 0], r["stop_logs"]  # SIGTERM: finish the batch, exit 0


def test_partitioned_workers_with_a_second_worker_on_one_partition(target: Target) -> None:
    r = race_scenario(
        target, partitions=2, spec=(0, 1, 0), seconds=3.0, seed=11, launch=forked_popen
    )
    _assert_exact(r)
    assert r["exit_codes"] == [0, 0, 0], r["stop_logs"]


def test_workers_sigkilled_at_random_and_restarted_end_exact(target: Target) -> None:
    r = race_scenario(
        target,
        partitions=2,
        spec=(0, 1, None),
        seconds=2.0,
        kills=3,
        seed=5,
        launch=forked_popen,
    )
    assert r["sigkills"] >= 3, r  # the kills happened, so the test is not vacuous
    assert not r["restart_errors"], r
    _assert_exact(r)
    assert r["exit_codes"] == [0, 0, 0], r["stop_logs"]


# --------------------------------------------------------------------------- the guard


class GatedExtractor:
    """The rules extractor, made to wait at its first capture until told to go on."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.go = threading.Event()
        self._rules = RuleBasedExtractor()

    def extract(self, capture: CapturedInteraction) -> ProposalBatch:
        self.reached.set()
        assert self.go.wait(60), "the test never released the extractor"
        return self._rules.extract(capture)


@contextmanager
def kernel_on(target: Target, **kw: Any) -> Iterator[Any]:
    kernel = open_kernel(target, **kw)
    try:
        yield kernel
    finally:
        kernel.close()


def test_a_batch_that_another_worker_saved_first_is_rolled_back_and_re_read(
    target: Target,
) -> None:
    """The overlap of FIELD-NOTES 8.2, made to happen: the slow worker reads captures
    1-8, the fast one reads 1-5 and saves position 5, then the slow one saves 8. The
    library's upsert accepts 8 > 5, so 1-5 would be extracted twice; the guard refuses
    (the slow batch started at 0), and the slow worker re-reads from 5."""
    from benchmarks.reliability import grant_all

    with kernel_on(target) as setup:
        grant_all(setup, "alice")
        for i in range(8):
            setup.capture("alice", interaction(f"I want to visit harbour number {i} soon"))
    gated = GatedExtractor()
    with (
        kernel_on(target, extractor=gated) as slow,
        kernel_on(target, projection_batch_size=5) as fast,
    ):
        result: list[int] = []
        thread = threading.Thread(target=lambda: result.append(slow.extraction.run_once()))
        thread.start()
        assert gated.reached.wait(60)  # slow has read captures 1-8 from position 0
        assert fast.extraction.run_once() == 5  # fast extracts 1-5 and saves first
        gated.go.set()
        thread.join(60)
        assert slow.extraction.moved_conflicts == 1  # slow's save was refused ...
        assert result == [3]  # ... and it redid only what was left: 6-8
        fast.process()
        counts = derived_counts(fast)
    assert counts["captures"] == 8
    assert counts["duplicate"] == 0 and counts["missing"] == 0, counts


def test_the_guarded_save_is_a_compare_and_set_with_a_typed_error(target: Target) -> None:
    with kernel_on(target) as kernel:
        app = kernel.app
        app.save_tracked([], GuardedTracking("guard-test", 5, expected=0))
        with pytest.raises(PositionMovedError) as moved:
            app.save_tracked([], GuardedTracking("guard-test", 7, expected=0))
        assert moved.value.expected == 0
        with pytest.raises(PositionMovedError):
            app.save_tracked([], GuardedTracking("guard-test", 9, expected=3))
        assert app.tracking_position("guard-test") == 5
        app.save_tracked([], GuardedTracking("guard-test", 9, expected=5))
        assert app.tracking_position("guard-test") == 9
    with pytest.raises(ValueError, match="forward"):
        GuardedTracking("guard-test", 9, expected=9)


# ----------------------------------------------------------------------- partitions


def test_a_database_keeps_one_partition_count(target: Target) -> None:
    with kernel_on(target, worker_partitions=3):
        pass
    with pytest.raises(PartitioningMismatchError, match="records 3"):
        open_kernel(target, worker_partitions=2)
    with kernel_on(target, worker_partitions=3):
        pass


def test_an_unpartitioned_log_that_has_moved_refuses_partitions(target: Target) -> None:
    from benchmarks.reliability import grant_all

    with kernel_on(target) as kernel:
        grant_all(kernel, "alice")
        kernel.capture("alice", interaction("I want to learn the cello"))
        kernel.process()
    with pytest.raises(PartitioningMismatchError):
        open_kernel(target, worker_partitions=2)


def test_read_your_writes_waits_for_the_partition_that_covers_the_subject(
    target: Target,
) -> None:
    from benchmarks.reliability import grant_all

    with kernel_on(target, worker_partitions=2, background_workers=True, run_worker=False) as api:
        grant_all(api, "alice")
        api.capture("alice", interaction("I want to adopt a greyhound"))
        stream = api.stream_of("alice")
        mine = api.extraction.tracking_name_for(stream)
        k = 0 if mine.endswith("p0of2") else 1
        with kernel_on(target, worker_partitions=2, partitions=[1 - k]) as other:
            other.process()  # the other partition only: alice's capture stays pending
        assert not api.ensure_subject_fresh(stream, 0.0).fresh
        with kernel_on(target, worker_partitions=2, partitions=[k]) as own:
            own.process()
        assert api.ensure_subject_fresh(stream, 0.0).fresh
        counts = derived_counts(api)
        assert counts["captures"] == 1 and counts["view_missing"] == 0, counts


def _stacks_dumped(child: Child, timeout_s: float = 120.0) -> list[str]:
    """The stderr lines of ``child`` up to its main thread's frame in ``uprof/cli/worker.py``
    (the stack dump SIGUSR1 asks for). Fails if stderr ends first: the process ended."""
    assert child.proc is not None and child.proc.stderr is not None
    proc, lines = child.proc, []
    deadline = time.monotonic() + timeout_s
    while not any("uprof/cli/worker.py" in line for line in lines):
        left = deadline - time.monotonic()
        line = line_within(proc.stderr, max(left, 0.0), proc.kill)
        assert line is not None, f"no stack dump within {timeout_s:.0f} s: {lines}"
        assert line != "", f"the worker ended (exit {proc.wait(60)}) after: {lines}"
        lines.append(line)
    return lines


def test_sigusr1_makes_a_worker_write_its_stacks_and_go_on(target: Target) -> None:
    """How a worker that does not stop is diagnosed: SIGUSR1 dumps every thread's stack
    to stderr, and the worker keeps working and still stops gracefully on SIGTERM.

    Waits for the dump itself (not a fixed time): SIGUSR1's default action ends the
    process, so a worker without the handler closes its stderr instead of writing it."""
    import signal

    from benchmarks.workers_bench import _seed, wait_caught_up, worker_child

    _seed(target, 1, ["alice"])
    child = worker_child(target, 1, None)
    child.start()
    assert child.proc is not None
    with killed_on_failure([child]):
        child.proc.send_signal(signal.SIGUSR1)
        dump = _stacks_dumped(child)
        assert child.proc.poll() is None, "SIGUSR1 must not stop the worker"
        # At least the main thread's stack, wherever the signal found it.
        assert any("(most recent call first)" in line for line in dump), dump
        # It goes on: a capture made after the dump is extracted and projected.
        kernel = open_kernel(target, worker_partitions=1)
        try:
            kernel.capture("alice", interaction("I want to learn the cello"))
            assert wait_caught_up(kernel, 120), kernel.lag()
        finally:
            kernel.close()
        assert child.sigterm() == 0, child.log
