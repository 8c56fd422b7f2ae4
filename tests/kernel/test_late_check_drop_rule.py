"""Review of decision 0112: the "failing for a reason of its own" rule may not drop a
batch while the audit store is what fails.

Decision 0112 drops a batch whose check failed three times in a row once the next
batch's check passes ("the store answers"). Two ways the next batch passes while the
store is the cause, each dropping a request a crash kept off the audit log (the
promise the check exists for, decision 0101), found in the review:

- the store reads but does not write (a full disk, a write lock held past the driver's
  wait, a read-only failover): the batch holding the lost request is the one batch
  that must write, the next one only reads;
- the next batch never asks the store (its subjects were erased since: nothing to
  check), so its passing says nothing of the store.

A store's failure (a driver error, a busy store) never drops a batch: it is tried again
after the back-off, however long it lasts. Both backends.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import consent, running, say, settings_for
from tests.kernel.test_capture_accepted_reconciled import LATE, accepted
from tests.kernel.test_late_check_durable import killed_after_commit
from uprof.kernel import Uprof
from uprof.services.late_captures import LateCaptures


def _store_error(statement: str, message: str) -> sa.exc.OperationalError:
    return sa.exc.OperationalError(statement, {}, sqlite3.OperationalError(message))


class _Failing:
    """The check's view of the audit store (``holding``) or trail (``record_many``),
    failing as a store does while ``failing`` is set."""

    def __init__(self, inner: Any, method: str, message: str) -> None:
        self._inner, self._method, self._message = inner, method, message
        self.failing = True
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name != self._method:
            return attr

        def call(*a: Any, **k: Any) -> Any:
            self.calls += 1
            if self.failing:
                raise _store_error(f"{self._method} (audit)", self._message)
            return attr(*a, **k)

        return call


def _late(kernel: Uprof) -> LateCaptures:
    late = kernel.extraction.late_captures
    assert isinstance(late, LateCaptures)
    return late


def _runs(kernel: Uprof, late: LateCaptures, rounds: int, since: list[int]) -> None:
    """``rounds`` pipeline runs, each after the back-off of the one before has passed."""
    for _ in range(rounds):
        since[0] += 1
        when = datetime.now(UTC) + timedelta(seconds=120 * since[0])
        late._now = lambda when=when: when  # type: ignore[method-assign]
        kernel.process()


def test_a_store_that_reads_but_does_not_write_drops_no_lost_request(
    backend: Backend, clock: FakeClock
) -> None:
    settings = settings_for(backend).model_copy(
        update={"late_capture_check_s": 0, "projection_batch_size": 2}
    )
    with running(settings, clock) as kernel:
        consent(kernel, "alice")
        consent(kernel, "bob")
    killed_after_commit(backend, 1)  # alice's request: stored, its entry lost
    with running(settings, clock) as kernel:
        late = _late(kernel)
        writes = _Failing(late._audit, "record_many", "database or disk is full")
        late._audit = writes  # type: ignore[assignment]
        kernel.capture("bob", say("I collect stamp number 1"))  # the next batch: on the log
        since = [0]
        _runs(kernel, late, 8, since)
        assert writes.calls >= 3  # the lost request's entry was tried, and failed
        assert late.dropped == 0
        writes.failing = False  # the disk has room again
        _runs(kernel, late, 3, since)
        lost = [e for e in accepted(kernel) if e.get("reason_code") == LATE]
        assert [e["counts"] for e in lost] == [{"events": 2}]


def test_a_next_batch_that_never_asks_the_store_proves_nothing(
    backend: Backend, clock: FakeClock
) -> None:
    settings = settings_for(backend).model_copy(
        update={"late_capture_check_s": 0, "projection_batch_size": 2}
    )
    with running(settings, clock) as kernel:
        consent(kernel, "alice")
        consent(kernel, "bob")
    killed_after_commit(backend, 1)  # alice's request: stored, its entry lost
    with running(settings, clock) as kernel:
        late = _late(kernel)
        reads = _Failing(late._log, "holding", "database is locked")
        late._log = reads  # type: ignore[assignment]
        kernel.capture("bob", say("I collect stamp number 1"))
        kernel.erase_subject("bob")  # the next batch: nothing left to ask the store
        since = [0]
        _runs(kernel, late, 8, since)
        assert reads.calls >= 3
        assert late.dropped == 0
        reads.failing = False  # the store answers again
        _runs(kernel, late, 3, since)
        lost = [e for e in accepted(kernel) if e.get("reason_code") == LATE]
        assert [e["counts"] for e in lost] == [{"events": 2}]


def test_two_workers_on_one_partition_name_a_lost_request_once(
    backend: Backend, clock: FakeClock
) -> None:
    """Held (review of 0112): two real worker processes run one partition at once; the
    compare-and-set lets neither move the check position past what it did not check,
    neither spins, and the lost request is named once."""
    from tests.children import PythonChild
    from tests.kernel.test_late_check_durable import worker_script

    settings = settings_for(backend).model_copy(update={"projection_batch_size": 2})
    with running(settings, clock) as kernel:
        consent(kernel, "alice")
        consent(kernel, "bob")
        for n in range(6):
            kernel.capture("bob", say(f"I collect stamp number {n}"))
    killed_after_commit(backend, 1)  # alice's request, lost
    script = worker_script(backend, partitions=1, owned=None, failing=False)
    children = [PythonChild(script), PythonChild(script)]
    for child in children:
        _, err = child.communicate(180)
        assert child.returncode == 0, err[-3000:]
    with running(settings, clock) as kernel:
        lost = [e for e in accepted(kernel) if e.get("reason_code") == LATE]
        assert [e["counts"] for e in lost] == [{"events": 2}]
        late = _late(kernel)
        name = kernel.extraction.tracking_name(0)
        assert kernel.app.check_position(late.check_row(name)) == (
            kernel.extraction.partition_position(0)
        )
