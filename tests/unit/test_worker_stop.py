"""The worker's stop flag can be set from a signal handler at any moment.

``uprof worker`` set a ``threading.Event`` from its SIGTERM handler while its main thread
waited on that Event. A handler that runs while ``Event.wait`` holds the Event's lock
(between two bytecodes of the same thread) waits for that lock forever: a worker that
never stopped, seen once in the suite (``test_workers``: "did not stop within the
timeout", the stack in ``on_signal`` -> ``Event.set``). The window is a few bytecodes
wide, so a single SIGTERM finds it rarely; here a timer signal sets the flag every
millisecond for three seconds while the main thread waits on it, which finds it every
time for an Event (the process hangs, or dies as nested handlers overflow the stack).
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import signal, sys, threading, time
from uprof.cli.worker import SignalledStop

stop = SignalledStop() if sys.argv[1] == "signalled" else threading.Event()
fired = 0

def on_alarm(signum, frame):
    global fired
    fired += 1
    stop.set()

signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
started = time.monotonic()
while time.monotonic() - started < 3:
    stop.wait(0)
    stop.wait(0.0005)
signal.setitimer(signal.ITIMER_REAL, 0)
print("stopped cleanly after", fired, "signals", flush=True)
"""


def _run(kind: str) -> subprocess.CompletedProcess[str] | None:
    """The script's result, or None when it hung past the timeout."""
    try:
        return subprocess.run(
            [sys.executable, "-c", SCRIPT, kind], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        return None


def test_a_signal_handler_sets_the_worker_stop_flag_while_the_loop_waits_on_it() -> None:
    done = _run("signalled")
    assert done is not None, "the process hung: the handler blocked"
    assert done.returncode == 0, done.stderr
    fired = int(done.stdout.split()[-2])
    assert fired > 500, done.stdout  # the handler really ran, many times, mid-wait


def test_the_same_signals_break_a_threading_event() -> None:
    """The control: the flag the worker used before hangs or crashes under the same
    signals, so the test above is not passing by being unable to catch the defect."""
    done = _run("event")
    assert done is None or done.returncode != 0, done.stdout if done else ""
