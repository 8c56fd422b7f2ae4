"""``uprof projections rebuild`` killed with SIGKILL in the middle of its replay (SQLite and
PostgreSQL, a real process killed).

Decision 0108 says a rebuild killed after its reset leaves positions the runners continue
from. Attacked in its review: the views are half empty when the process dies (the reset
committed, some batches replayed). A read that waits for its subject then either gets
the whole, right answer or says it timed out (``read_timeout``), never the half; the next
runner and the next rebuild bring the views back to what they were, and a subject erased
before the rebuild has no row in them at any point.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from domain.errors import ReadTimeoutError
from tests.children import PythonChild
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, say, settings_for
from uprof.kernel import Uprof
from uprof.settings import Settings

WAIT_S = 120
BATCH = 4
SUBJECTS = ["alice", "bob", "carol", "dave"]
ERASED = "erin"

#: A rebuild that stops for good after its second committed batch (the views reset,
#: partly replayed) and waits there to be killed.
REBUILD = """
import sys, time
from pathlib import Path
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for

backend = Backend(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
ready = Path(sys.argv[4])
settings = settings_for(backend).model_copy(update={"projection_batch_size": int(sys.argv[5])})
kernel = build_kernel(settings, FakeClock())
views = kernel.projections._views
apply = views.apply_batch
applied = []

def stopping(*args, **kwargs):
    result = apply(*args, **kwargs)  # its own transaction: committed when it returns
    applied.append(result)
    if len(applied) == 2:
        ready.touch()
        while True:
            time.sleep(1)  # killed here
    return result

views.apply_batch = stopping
kernel.rebuild()
"""


def _settings(backend: Backend, **update: Any) -> Settings:
    return settings_for(backend).model_copy(update={"projection_batch_size": BATCH, **update})


def _items(kernel: Uprof, subject: str) -> list[tuple[str, str]]:
    view = kernel.profile(subject)
    return sorted(
        [(type(i).__name__, str(i.item_id)) for i in (*view.attributes, *view.memories)]
        + [("consent", c.consent_id) for c in view.consents]
    )


def _rows_of(kernel: Uprof, stream: str) -> dict[str, int]:
    digest = kernel.queries.table_digest([stream])
    return {name: len(rows) for name, rows in digest.items() if rows}


def test_a_rebuild_killed_mid_replay_leaves_honest_reads_and_is_repaired(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    with_workers = _settings(backend, background_workers=True, read_wait_timeout_s=0.3)
    kernel = build_kernel(_settings(backend), clock)
    try:
        for n, subject in enumerate([*SUBJECTS, ERASED]):
            consent(kernel, subject)
            kernel.capture(subject, say(f"I live in Paris and I like tea number {n}", day=1))
            kernel.capture(subject, say(f"I want to climb a mountain, {subject}", day=2))
        kernel.process()
        erased_stream = str(kernel.stream_of(ERASED))
        kernel.erase_subject(ERASED)
        kernel.process()
        before = {s: _items(kernel, s) for s in SUBJECTS}
        live = kernel.queries.table_digest()
        assert _rows_of(kernel, erased_stream) == {}
        target = kernel.app.max_notification_id()

        ready = tmp_path / "ready"
        child = PythonChild(
            REBUILD, backend.kind, backend.url, str(backend.data_dir), str(ready), str(BATCH)
        )
        deadline = time.monotonic() + WAIT_S
        while not ready.exists():
            assert child.poll() is None, child.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the rebuild never replayed two batches"
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait(WAIT_S)
        assert child.returncode == -signal.SIGKILL

        # Killed mid-way: the reset committed, the replay stopped short of the log's end.
        assert 0 < kernel.projections.position < target
        assert kernel.queries.table_digest() != live
        assert _rows_of(kernel, erased_stream) == {}

        # A server's reads with no runner to catch up: the whole answer or a timeout.
        reader = build_kernel(with_workers, clock)
        try:
            answers: dict[str, str] = {}
            for subject in SUBJECTS:
                try:
                    got = _items(reader, subject)
                except ReadTimeoutError:
                    answers[subject] = "read_timeout"
                    continue
                assert got == before[subject], subject
                answers[subject] = "whole"
            assert "read_timeout" in answers.values(), answers  # some subject is behind
        finally:
            reader.close()

        # The next runner repairs the views (what a server's worker does from there).
        kernel.process()
        assert kernel.queries.table_digest() == live
        # And so does the next rebuild (its own reset and replay, alone this time).
        kernel.rebuild()
        assert kernel.queries.table_digest() == live
        assert {s: _items(kernel, s) for s in SUBJECTS} == before
        assert _rows_of(kernel, erased_stream) == {}
    finally:
        kernel.close()


@pytest.mark.parametrize("runner", ["rebuild", "process"])
def test_a_rebuild_killed_mid_replay_is_repaired_by_a_fresh_process(
    runner: str, backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The repair from a process that starts after the kill (``uprof projections run``
    or ``rebuild`` the next morning), not the one that watched it."""
    kernel = build_kernel(_settings(backend), clock)
    try:
        for n, subject in enumerate(SUBJECTS):
            consent(kernel, subject)
            kernel.capture(subject, say(f"I live in Lisbon and I read book {n}", day=1))
        kernel.process()
        live = kernel.queries.table_digest()
    finally:
        kernel.close()
    ready = tmp_path / "ready"
    child = PythonChild(
        REBUILD, backend.kind, backend.url, str(backend.data_dir), str(ready), str(BATCH)
    )
    deadline = time.monotonic() + WAIT_S
    while not ready.exists():
        assert child.poll() is None, child.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the rebuild never replayed two batches"
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait(WAIT_S)

    fresh = build_kernel(_settings(backend), clock)
    try:
        assert fresh.queries.table_digest() != live  # half empty
        fresh.rebuild() if runner == "rebuild" else fresh.process()
        assert fresh.queries.table_digest() == live
    finally:
        fresh.close()


#: One process's part in the race below, all started at once: ``rebuild`` (two of them),
#: ``erase`` (the erased subject, asked again while the views are being rebuilt, as a
#: client does on ``erasure_incomplete``) or ``worker`` (a runner looping until told).
RACER = """
import sys, time
from pathlib import Path
from domain.errors import ErasureIncompleteError
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for

backend = Backend(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
role, go, stop = sys.argv[4], Path(sys.argv[5]), Path(sys.argv[6])
settings = settings_for(backend).model_copy(update={"projection_batch_size": int(sys.argv[7])})
kernel = build_kernel(settings, FakeClock())
while not go.exists():
    time.sleep(0.005)
try:
    if role == "rebuild":
        kernel.rebuild()
    elif role == "erase":
        # Asked again until it completes, within a generous time (not a count of attempts,
        # which a loaded machine runs through while the rebuilds hold the views).
        deadline = time.monotonic() + float(sys.argv[9])
        while True:
            try:
                kernel.erase_subject(sys.argv[8])
                break
            except ErasureIncompleteError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"the erasure did not complete in {sys.argv[9]} s")
                time.sleep(0.1)
    else:
        while not stop.exists():
            kernel.process()
            time.sleep(0.01)
finally:
    kernel.close()
"""


def test_two_rebuilds_an_erasure_and_a_worker_at_once_in_four_processes(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Two ``uprof projections rebuild`` at once, beside a worker process and an erasure
    in a fourth: every process ends well, the erased subject has no row and every other
    subject's views equal a clean rebuild."""
    kernel = build_kernel(_settings(backend), clock)
    try:
        for n, subject in enumerate([*SUBJECTS, ERASED]):
            consent(kernel, subject)
            for day in (1, 2, 3):
                kernel.capture(subject, say(f"I like tea number {n}{day} in Paris", day=day))
        kernel.process()
        erased_stream = str(kernel.stream_of(ERASED))
        before = {s: _items(kernel, s) for s in SUBJECTS}
        go, stop = tmp_path / "go", tmp_path / "stop"
        args = (backend.kind, backend.url, str(backend.data_dir))
        racers = {
            role: PythonChild(
                RACER,
                *args,
                role.rstrip("12"),
                str(go),
                str(stop),
                str(BATCH),
                ERASED,
                str(WAIT_S * 2),
            )
            for role in ("rebuild1", "rebuild2", "erase", "worker")
        }
        go.touch()
        try:
            for role in ("rebuild1", "rebuild2", "erase"):
                _, err = racers[role].communicate(timeout=WAIT_S * 3)
                assert racers[role].returncode == 0, (role, err[-3000:])
        finally:
            stop.touch()
            for racer in racers.values():
                if racer.poll() is None and racer is not racers["worker"]:
                    racer.kill()  # a wait that ran out: no racer outlives the test
            _, err = racers["worker"].communicate(timeout=WAIT_S)
        assert racers["worker"].returncode == 0, err[-3000:]

        kernel.process()
        assert _rows_of(kernel, erased_stream) == {}
        assert {s: _items(kernel, s) for s in SUBJECTS} == before
        live = kernel.queries.table_digest()
        kernel.rebuild()
        assert kernel.queries.table_digest() == live
    finally:
        kernel.close()
