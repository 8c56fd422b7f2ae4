"""The reliability harness's own child processes (benchmarks/reliability.py and
workers_bench.py): a child that never says it is ready ends the wait instead of hanging
the run, and a scenario that fails leaves no ``uprof worker`` running (a worker stops
only when sent SIGTERM)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from benchmarks import reliability, workers_bench
from benchmarks.reliability import Target
from benchmarks.workers_bench import Child

sqlite_only = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


SILENT = [sys.executable, "-c", "import time; time.sleep(600)"]


def _within(seconds: float, call: Callable[[], object]) -> list[BaseException]:
    """Run ``call`` in a thread; the exceptions it raised, or AssertionError if it is
    still running after ``seconds`` (a hang: the old read had no bound)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the wait for the child's first line never ended"
    return errors


def test_a_crash_child_that_never_says_ready_is_killed_once_the_start_timeout_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reliability, "START_TIMEOUT_S", 2.0, raising=False)  # old code: none
    child = subprocess.Popen(SILENT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        errors = _within(60, lambda: reliability._kill_after_ready(child, 0.0))
        assert len(errors) == 1 and "nothing within 2 s" in str(errors[0]), errors
        assert child.poll() is not None  # killed and reaped
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(60)


def test_a_worker_that_never_says_ready_is_killed_once_its_start_timeout_passes() -> None:
    """The wait read the child's stdout with no bound: a worker stuck in its start-up
    (a lock, a store that does not answer) hung the test, and the suite, for good."""
    # The command is [python, *entry, *args]: a Python process that prints nothing.
    child = Child(SILENT[1:], {}, "uprof worker ready", entry=[])
    child.start_timeout_s = 2.0
    child.spawn()
    try:
        errors = _within(60, child.wait_ready)
        assert len(errors) == 1 and "not ready within 2 s" in str(errors[0]), errors
        assert child.proc is not None and child.proc.poll() is not None  # killed and reaped
    finally:
        _kill(child)


@sqlite_only
def test_a_race_that_fails_midway_leaves_no_worker_running(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[Child] = []
    real_layout = workers_bench.layout_children

    def layout(*args: Any) -> list[Child]:
        children = real_layout(*args)
        started.extend(children)
        return children

    calls = 0
    real_capture = workers_bench._capture_for

    def capture_then_fail(*args: Any, **kwargs: Any) -> list[str]:
        nonlocal calls
        calls += 1
        if calls == 1:  # the backlog, before the workers start
            return real_capture(*args, **kwargs)
        raise ConnectionError("the store went away")  # once they run

    monkeypatch.setattr(workers_bench, "layout_children", layout)
    monkeypatch.setattr(workers_bench, "_capture_for", capture_then_fail)
    try:
        with pytest.raises(ConnectionError):
            workers_bench.race_scenario(target, partitions=1, spec=(None, None), seconds=0.3)
        assert len(started) == 2 and all(c.proc is not None for c in started)
        running = [c.proc.pid for c in started if c.proc is not None and c.proc.poll() is None]
        assert running == [], f"workers left running after the scenario failed: {running}"
    finally:
        for child in started:
            _kill(child)


def _kill(child: Child) -> None:
    if child.proc is not None and child.proc.poll() is None:
        child.proc.kill()
        child.proc.wait(60)  # not communicate(): a waiting thread may still read its stdout
