"""The late ``capture.accepted`` check survives the worker: what is left to check is durable.

Decisions 0101, 0104 and 0107 kept the batches waiting for their check (and the positions
spilled past the bound) in the worker's memory. A worker stopped or killed while the
audit store failed took them with it: the extraction position had moved past those
captures, no later batch read them again, and a request a crash had kept off the audit
log stayed unnamed for ever. A check that failed for ever on one batch for a reason of
its own held every later check until the process stopped.

Now each partition's extraction position has a check position beside it (a row of the
same tracking table): captures after it are still to be checked, whichever process
extracted them. Real processes: the lost request comes from a process killed with exit 9
after its commit; the worker that extracted it is killed with SIGKILL while its audit
reads fail; another process, started with the audit store answering, names the request.
Both backends.
"""

from __future__ import annotations

import signal
import textwrap
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest

from tests.children import PythonChild, run_python
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import consent, running, say, settings_for
from tests.kernel.test_capture_accepted_reconciled import (
    CHILD_TIMEOUT_S,
    LATE,
    TEXTS,
    accepted,
)
from uprof.kernel import Uprof
from uprof.partitions import Partitioning
from uprof.services.late_captures import LateCaptures


def worker_script(
    backend: Backend, *, partitions: int, owned: list[int] | None, failing: bool
) -> str:
    """A real worker process: with ``failing``, its audit store does not answer the
    check's reads (a driver error), it extracts what there is, says so and waits to be
    killed; else it runs until idle and ends."""
    return textwrap.dedent(
        f"""
        import sqlite3, time
        from pathlib import Path
        import sqlalchemy as sa
        from tests.conftest import Backend
        from tests.fakes.ports import FakeClock
        from tests.kernel.conftest import settings_for
        from uprof.bootstrap import bootstrap
        from tests.fakes.ports import FakeExtractor
        from uprof.adapters.embeddings import HashingEmbedder

        backend = Backend({backend.kind!r}, {backend.url!r}, Path({str(backend.data_dir)!r}))
        settings = settings_for(backend).model_copy(
            update={{"late_capture_check_s": 0, "worker_partitions": {partitions}}}
        )
        kernel = bootstrap(settings, clock=FakeClock(), embedder=HashingEmbedder(),
                           extractor=FakeExtractor(), partitions={owned!r})
        late = kernel.extraction.late_captures
        if {failing!r}:
            def failing(*_a, **_k):
                raise sa.exc.OperationalError(
                    "SELECT entry_json FROM audit_entries", {{}},
                    sqlite3.OperationalError("database is locked"))
            late._log.holding = failing
            kernel.extraction.run_until_idle()
            assert late.failures >= 1 and late.waiting > 0, (late.failures, late.waiting)
            print("extracted, check failed", flush=True)
            time.sleep(600)
        else:
            try:
                kernel.extraction.run_until_idle()
                print("failures", late.failures, flush=True)
            finally:
                kernel.close()
        """
    )


def killed_after_commit(backend: Backend, partitions: int) -> None:
    """A real capture process killed (exit 9) after its commit, at its audit append."""
    died = run_python(
        textwrap.dedent(
            f"""
            import os
            from pathlib import Path
            from tests.conftest import Backend
            from tests.fakes.ports import FakeClock
            from tests.kernel.conftest import build_kernel, say, settings_for

            backend = Backend({backend.kind!r}, {backend.url!r}, Path({str(backend.data_dir)!r}))
            settings = settings_for(backend).model_copy(
                update={{"worker_partitions": {partitions}}}
            )
            kernel = build_kernel(settings, FakeClock())
            kernel.capture_service._audit.record_many = lambda *a, **k: os._exit(9)
            kernel.capture_many("alice", [say(t) for t in {list(TEXTS[:2])!r}])
            """
        ),
        timeout=CHILD_TIMEOUT_S,
    )
    assert died.returncode == 9, died.stderr[-3000:]


def killed_while_checks_fail(backend: Backend, partitions: int, owned: list[int] | None) -> None:
    child = PythonChild(
        worker_script(backend, partitions=partitions, owned=owned, failing=True),
        stream_stdout=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
    finally:
        child.send_signal(signal.SIGKILL)
        _, err = child.communicate(CHILD_TIMEOUT_S)
    assert line.startswith("extracted"), err[-3000:]
    assert child.returncode == -signal.SIGKILL


def restarted(backend: Backend, partitions: int, owned: list[int] | None) -> None:
    child = PythonChild(worker_script(backend, partitions=partitions, owned=owned, failing=False))
    out, err = child.communicate(CHILD_TIMEOUT_S)
    assert child.returncode == 0, err[-3000:]
    assert "failures 0" in out


def alice_stream(kernel: Uprof) -> UUID:
    return next(
        n.originator_id
        for n in kernel.app.notifications_after(0, 1000)
        if n.topic.endswith("InteractionCaptured")
    )


@pytest.mark.parametrize(
    ("partitions", "takeover"),
    [(1, False), (2, True)],
    ids=["restarted", "another-process-takes-the-partition"],
)
def test_a_worker_killed_while_checks_fail_leaves_them_to_the_next(
    backend: Backend, clock: FakeClock, partitions: int, takeover: bool
) -> None:
    settings = settings_for(backend).model_copy(update={"worker_partitions": partitions})
    with running(settings, clock) as kernel:
        consent(kernel, "alice")
    killed_after_commit(backend, partitions)  # stored, its capture.accepted lost
    with running(settings, clock) as kernel:
        assert accepted(kernel) == []
        k = Partitioning(partitions).of(alice_stream(kernel))
    # The worker of alice's partition extracts her request; its audit reads fail; SIGKILL.
    killed_while_checks_fail(backend, partitions, [k] if takeover else None)
    with running(settings, clock) as kernel:
        assert kernel.extraction.partition_position(k) > 0  # extracted, not checked
        assert accepted(kernel) == []
    # Restarted (or all partitions in another process), the audit store answering.
    restarted(backend, partitions, None)
    with running(settings, clock) as kernel:
        (entry,) = accepted(kernel)
        assert entry["reason_code"] == LATE
        assert entry["counts"] == {"events": 2}
    restarted(backend, partitions, None)  # checked once: nothing named twice
    with running(settings, clock) as kernel:
        assert len(accepted(kernel)) == 1


def test_a_batch_failing_for_a_reason_of_its_own_holds_no_later_check(
    backend: Backend, clock: FakeClock
) -> None:
    """One batch's check fails at every attempt while the audit store answers the others
    (none is known; an entry the store cannot take, say): after a few attempts it is set
    aside (counted and logged), and the requests after it are still named."""
    settings = settings_for(backend).model_copy(
        update={"late_capture_check_s": 0, "projection_batch_size": 2}
    )
    with running(settings, clock) as kernel:
        consent(kernel, "alice")
        consent(kernel, "bob")
        kernel.capture("bob", say("I collect stamp number 1"))
        late = kernel.extraction.late_captures
        assert isinstance(late, LateCaptures)
        reconcile = late._reconcile
        poisoned: list[int] = []

        def own_failure(captured: Any, batch_end: int) -> bool:
            if not poisoned or poisoned[0] == batch_end:
                poisoned[:1] = [batch_end]
                raise RuntimeError("this batch's own failure")
            return reconcile(captured, batch_end)  # whether it asked the store

        late._reconcile = own_failure  # type: ignore[method-assign]
        kernel.process()
        killed_after_commit(backend, 1)  # then alice's lost request
        for n in range(8):  # back-offs pass between the runs
            kernel.process()
            when = datetime.now(UTC) + timedelta(seconds=120 * (n + 1))
            late._now = lambda when=when: when  # type: ignore[method-assign]
        lost = [e for e in accepted(kernel) if e.get("reason_code") == LATE]
        assert [e["counts"] for e in lost] == [{"events": 2}]
        assert late.dropped == 1


def test_memory_stays_bounded_within_the_grace_and_nothing_is_lost(
    backend: Backend, clock: FakeClock
) -> None:
    """The bound holds while checks succeed too (a flood within the grace): past it the
    oldest batches are let go from memory and read again from the log once old enough,
    so the lost request among them is still named, once."""
    settings = settings_for(backend).model_copy(update={"projection_batch_size": 2})
    with running(settings, clock) as kernel:
        consent(kernel, "alice")
        consent(kernel, "bob")
        late = kernel.extraction.late_captures
        assert isinstance(late, LateCaptures)
        late.max_waiting = 2
        killed_after_commit(backend, 1)  # alice's request, lost
        for n in range(6):
            kernel.capture("bob", say(f"I collect stamp number {n}"))
            kernel.process()
            assert late.waiting <= 2
        assert accepted(kernel) and not [
            e for e in accepted(kernel) if e.get("reason_code") == LATE
        ]  # within the grace: nothing checked yet
        when = datetime.now(UTC) + timedelta(seconds=120)
        late._now = lambda: when  # type: ignore[method-assign]
        kernel.process()
        kernel.process()
        lost = [e for e in accepted(kernel) if e.get("reason_code") == LATE]
        assert [e["counts"] for e in lost] == [{"events": 2}]
        assert late.waiting == 0 and late.dropped == 0
