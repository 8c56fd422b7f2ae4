"""The reliability harness's own child processes (benchmarks/reliability.py and
workers_bench.py): a child that never says it is ready ends the wait instead of hanging
the run, and a scenario that fails leaves no ``uprof worker`` running (a worker stops
only when sent SIGTERM)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks import reliability, workers_bench
from benchmarks.reliability import Target
from benchmarks.workers_bench import Child

sqlite_only = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


REPO = Path(__file__).resolve().parents[2]
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


def _pytest_on(folder: Path, source: str, *options: str) -> subprocess.CompletedProcess[str]:
    """A pytest run, in another process and outside this suite's settings, of ``source``
    as the one test file in ``folder``; a run still going after 120 s fails the caller."""
    (folder / "test_sample.py").write_text(source)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", "/dev/null"]
    command += ["--rootdir", str(folder), *options, str(folder)]
    try:
        return subprocess.run(
            command, cwd=REPO, capture_output=True, text=True, timeout=120, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the run hung: {e.stdout!r}") from None


LEAVES_A_CHILD = """
import multiprocessing, time

def _forever():
    time.sleep(600)

def _start():
    child = multiprocessing.get_context("spawn").Process(target=_forever)
    child.start()
    return child

def test_fails_with_a_child_running():
    _start()
    assert False, "failed after starting a child"

def test_passes_with_a_child_running():
    _start()
"""


def test_a_test_that_leaves_a_multiprocessing_child_running_ends_the_run_with_a_report(
    tmp_path: Path,
) -> None:
    """multiprocessing joins its children, with no bound, when the test process exits: a
    test that failed (or forgot a join) with a child still running hung the whole run
    after its last test. tests/conftest.py kills such children when the test ends."""
    done = _pytest_on(tmp_path, LEAVES_A_CHILD, "-p", "tests.conftest")
    assert "2 failed" in done.stdout, done.stdout[-3000:]  # the second: its leftover child
    assert "the test left multiprocessing children running" in done.stdout


HOLDS_A_CHILD = """
import pytest

from tests.children import PythonChild, held_by_fixture

FOREVER = "import time; time.sleep(600)"


@pytest.fixture
def stopped():
    child = PythonChild(FOREVER)
    with held_by_fixture(child):
        yield child
        child.kill()
        child.wait(30)


@pytest.fixture
def left():
    child = PythonChild(FOREVER)
    with held_by_fixture(child):
        yield child


def test_a_fixtures_child_outlives_the_body(stopped):
    assert stopped.poll() is None


def test_a_fixture_that_leaves_its_child(left):
    assert left.poll() is None


def test_a_body_that_leaves_a_child():
    PythonChild(FOREVER)
"""


def test_a_child_held_by_a_fixture_lives_until_its_teardown_and_must_be_stopped_there(
    tmp_path: Path,
) -> None:
    """A fixture's forked server (``tests.children.held_by_fixture``) runs past the test's
    body, which the leftover-children check runs after; the fixture stops it, and one
    left running is killed and fails the fixture's teardown. A child the body leaves is
    still the body's failure."""
    done = _pytest_on(tmp_path, HOLDS_A_CHILD, "-p", "tests.conftest")
    out = done.stdout
    # The second test's body passes, then its fixture's teardown is the error.
    assert "1 failed, 2 passed, 1 error" in out, out[-3000:]
    assert "a fixture left its child running" in out, out[-3000:]
    assert "the test left multiprocessing children running" in out, out[-3000:]
    # A summary line ends with " - <its error>" where the terminal is wide enough (CI's
    # was, a helper's run was not): the test's name is what comes before it.
    summary = [
        line.split("::")[-1].split(" - ")[0]
        for line in out.splitlines()
        if "test_sample.py::" in line
    ]
    assert [s for s in summary if s.startswith("test_a_")] == [
        "test_a_body_that_leaves_a_child",
        "test_a_fixture_that_leaves_its_child",
    ], out[-3000:]


def test_a_server_that_ignores_sigterm_is_killed_and_reaped_by_stop_server() -> None:
    """``terminate(); wait(60)`` raised on such a server and left it running, serving
    (or holding the store of) a test that had ended."""
    from benchmarks.server_ready import stop_server

    script = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    script += "print('ignoring', flush=True); time.sleep(600)"
    deaf = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert deaf.stdout is not None and deaf.stdout.readline() == "ignoring\n"
        assert stop_server(deaf, timeout_s=1) is None  # not a graceful stop: killed
        assert deaf.returncode == -9
    finally:
        if deaf.poll() is None:
            deaf.kill()
            deaf.wait(60)


HANGS_ON_A_SILENT_CHILD = """
import subprocess, sys

def test_waits_on_a_child_that_never_answers():
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], stdout=subprocess.PIPE
    )
    try:
        child.stdout.readline()  # no bound: the kind of wait that hung runs before
    finally:
        child.kill()
        child.wait()
"""


def test_a_test_that_waits_for_ever_fails_at_the_suites_timeout(
    tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    """pyproject.toml gives every test a time limit (pytest-timeout): a hang ends as a
    failure naming the test and its stacks, not as a CI run killed at its limit. Here the
    limit is lowered to 3 s for a test blocked reading a child's silent pipe."""
    assert float(pytestconfig.getini("timeout")) > 0  # the suite itself runs with a limit
    done = _pytest_on(tmp_path, HANGS_ON_A_SILENT_CHILD, "-o", "timeout=3")
    assert "1 failed" in done.stdout, done.stdout[-3000:]
    assert "Timeout" in done.stdout and "readline" in done.stdout, done.stdout[-3000:]
