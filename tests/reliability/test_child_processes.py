"""The reliability harness's own child processes (benchmarks/workers_bench.py): a child
that never gets ready ends the wait instead of hanging the run, and a scenario that fails
leaves no ``uprof worker`` running (a worker stops only when sent SIGTERM)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from benchmarks import workers_bench
from benchmarks.reliability import Target
from benchmarks.workers_bench import Child

sqlite_only = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


def test_a_worker_that_never_says_ready_is_killed_once_its_start_timeout_passes() -> None:
    """The wait read the child's stdout with no bound: a worker stuck in its start-up
    (a lock, a store that does not answer) hung the test, and the suite, for good."""
    # A Python process that prints nothing (the command is [python, *entry, *args]).
    child = Child(["-c", "import time; time.sleep(600)"], {}, "uprof worker ready", entry=[])
    child.start_timeout_s = 2.0
    child.spawn()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            child.wait_ready()
        except BaseException as e:
            errors.append(e)

    waiting = threading.Thread(target=wait, daemon=True)
    waiting.start()
    try:
        waiting.join(60)
        assert not waiting.is_alive(), "the wait for the ready line never ended"
        assert len(errors) == 1 and isinstance(errors[0], RuntimeError), errors
        assert "not ready within 2 s" in str(errors[0])
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
