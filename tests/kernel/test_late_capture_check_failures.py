"""The extraction worker's late ``capture.accepted`` check failing on a store error.

The check (decision 0101-capture-accepted-reconciled) is optional reconciliation run
after a batch's save has committed. It caught only ``UprofError``: a driver error (the
audit store not answering: PostgreSQL's connection dropped, SQLite's "database is
locked" on a read, a table gone) went up through the worker's batch. Then the batch being
checked was dropped unchecked (its lost request never recorded), the same batch's
``item.rebirth_refused`` and ``capture.quarantined`` entries were never appended, and every
pipeline run raised after one extraction batch, before any projection: with captures
arriving, nothing was projected while the check kept failing. Now a failed check keeps
its batch for a later check (backing off), counts the failure and logs it (class name
only); past its bound a backlog keeps its positions only and is read again when checked
(until a later review it was dropped). Both
backends; the lost request comes from a real process killed with exit 9 after its
commit.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, say, settings_for
from tests.kernel.test_capture_accepted_reconciled import (
    LATE,
    TEXTS,
    accepted,
    killed_after_commit,
)
from tests.kernel.test_erased_items_not_reborn import (
    SAIL,
    captured_then_backed_up,
    erase_after_extraction,
    items_of,
    refusals,
)
from uprof.kernel import Uprof
from uprof.services import late_captures
from uprof.services.backup import restore
from uprof.services.late_captures import LateCaptures


def checking_now(backend: Backend, clock: FakeClock, **update: Any) -> Uprof:
    """An in-process worker with no grace (the capture processes are dead already)."""
    settings = settings_for(backend).model_copy(update={"late_capture_check_s": 0, **update})
    return build_kernel(settings, clock)


def late_of(kernel: Uprof) -> LateCaptures:
    late = kernel.extraction._late
    assert late is not None
    return late


def later(late: LateCaptures, s: float) -> None:
    """Move the check's wall clock ``s`` seconds on (past its back-off)."""
    at = datetime.now(UTC) + timedelta(seconds=s)
    late._now = lambda: at


@pytest.fixture
def renamed_audit_table(backend: Backend) -> Iterator[Callable[[Uprof, bool], None]]:
    """Take the audit log's entries table away from under a running kernel (and put it
    back): every read of it then fails in the driver, as a store that stopped answering."""

    def rename(kernel: Uprof, away: bool) -> None:
        old, new = ("audit_entries", "audit_entries_away")[:: 1 if away else -1]
        with kernel.audit_log._engine.begin() as conn:
            conn.execute(sa.text(f"ALTER TABLE {old} RENAME TO {new}"))

    yield rename


def driver_error(backend: Backend) -> sa.exc.OperationalError:
    """What the audit store raises when its database does not answer a read."""
    if backend.kind == "postgres":
        import psycopg

        orig: Exception = psycopg.OperationalError(
            "terminating connection due to administrator command"
        )
    else:
        orig = sqlite3.OperationalError("database is locked")
    return sa.exc.OperationalError("SELECT entry_json FROM audit_entries", {}, orig)


class AuditOutage:
    """The check's audit reads fail in the driver, as a store that stopped answering,
    until ``answering`` is set; ``calls`` counts the reads tried."""

    def __init__(self, backend: Backend, late: LateCaptures) -> None:
        self.error = driver_error(backend)
        self.answering = False
        self.calls = 0
        self._holding = late._log.holding
        late._log.holding = self._read  # type: ignore[method-assign]

    def _read(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if not self.answering:
            raise self.error
        return self._holding(*args, **kwargs)


def test_a_failed_check_keeps_its_batch_and_the_worker_goes_on(
    backend: Backend, clock: FakeClock, renamed_audit_table: Callable[[Uprof, bool], None]
) -> None:
    kernel = checking_now(backend, clock)
    try:
        consent(kernel, "alice")
        killed_after_commit(backend, TEXTS[:2])
        renamed_audit_table(kernel, True)
        try:
            # The extraction commits; the check fails; the run does not.
            assert kernel.process_once() > 0
            late = late_of(kernel)
            assert late.failures == 1
            assert late.waiting == 2  # kept, not dropped
        finally:
            renamed_audit_table(kernel, False)
        kernel.process()  # within the back-off: not tried again yet
        assert accepted(kernel) == []
        later(late, 120)
        kernel.process()
        (entry,) = accepted(kernel)
        assert entry["reason_code"] == LATE
        assert entry["counts"] == {"events": 2}
        assert late.waiting == 0
        assert len(kernel.profile("alice").memories) == 2
    finally:
        kernel.close()


def test_a_failed_check_loses_no_rebirth_refusal_of_its_batch(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The batch that dropped an erased item's proposals commits; its check fails; the
    ``item.rebirth_refused`` entry is still appended (it could never be found again)."""
    settings = settings_for(backend)
    captured_then_backed_up(settings, clock, tmp_path / "bk", SAIL)
    left = erase_after_extraction(settings, clock, "attribute")
    restore(settings, tmp_path / "bk")
    kernel = checking_now(backend, clock)
    try:
        error = driver_error(backend)

        def failing(*_a: Any, **_k: Any) -> Any:
            raise error

        late_of(kernel)._log.holding = failing  # type: ignore[method-assign]
        kernel.process()
        assert items_of(kernel) == left
        [entry] = refusals(kernel)
        assert entry["counts"] == {"attribute": 1}
        assert late_of(kernel).failures >= 1
    finally:
        kernel.close()


def test_a_check_that_keeps_failing_neither_stops_projection_nor_goes_unseen(
    backend: Backend, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    kernel = checking_now(backend, clock, projection_batch_size=2)
    try:
        consent(kernel, "alice")
        late = late_of(kernel)
        outage = AuditOutage(backend, late)
        late.max_waiting = 4
        texts = [f"I collect stamp number {n}" for n in range(8)]
        for text in texts:
            kernel.capture("alice", say(text))
        with caplog.at_level(logging.WARNING, logger="uprof.services.late_captures"):
            for _ in range(4):  # back-offs pass between the runs
                kernel.process()
                later(late, late.failures * 120)
        # Extraction and projection kept going.
        assert len(kernel.profile("alice").memories) == len(texts)
        # Each failed check is counted (a check may read twice: after a few failures
        # in a row the next batch is tried, to tell an outage from a batch's own failure).
        assert late.failures >= 2 and outage.calls >= late.failures
        # Bounded in memory: what was past the bound kept its positions only (said),
        # nothing was dropped (a later review of decision 0104).
        assert late.waiting <= 4
        assert late.dropped == 0
        messages = [r for r in caplog.records if r.name == "uprof.services.late_captures"]
        assert any("kept as positions only" in r.getMessage() for r in messages)
        assert any("OperationalError" in r.getMessage() for r in messages)
        assert not any(t in r.getMessage() for r in messages for t in texts)
    finally:
        kernel.close()


def test_a_declared_refusal_drops_its_batch_and_the_next_is_checked() -> None:
    """An entry the audit log refuses is refused at every attempt: that batch is dropped
    (counted, an error line) and the batches after it are still checked; a busy store
    (``StoreBusyError``) is not a refusal: its batch is kept."""
    from types import SimpleNamespace
    from uuid import uuid4

    from audit.errors import AuditEntryError
    from domain.errors import StoreBusyError

    class Positions:  # the event store's check positions, and nothing else
        def __init__(self) -> None:
            self.rows: dict[str, int] = {}

        def check_position(self, name: str) -> int | None:
            return self.rows.get(name)

        def start_check_position(self, name: str, at: int) -> int:
            return self.rows.setdefault(name, at)

        def move_check_position(self, name: str, expected: int, to: int) -> bool:
            if self.rows.get(name) != expected:
                return False
            self.rows[name] = to
            return True

    positions = Positions()
    late = LateCaptures(positions, None, None, dict, grace_s=0)  # type: ignore[arg-type]
    late.follow("worker", lambda _stream: True)
    late.begin("worker", 0)
    checked: list[int] = []
    answers: list[Exception | None] = [AuditEntryError("refused"), None, StoreBusyError("busy")]

    def reconcile(captures: Any, batch_end: int) -> None:
        checked.append(batch_end)
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    late._reconcile = reconcile  # type: ignore[method-assign]

    def batch(nid: int) -> list[tuple[Any, Any]]:
        n = SimpleNamespace(id=nid, originator_version=1)
        return [(n, SimpleNamespace(originator_id=uuid4(), timestamp=None))]

    late.extracted(batch(1), 1, extraction="worker", start=0)  # refused: dropped
    late.extracted(batch(2), 2, extraction="worker", start=1)  # checked
    late.extracted(batch(3), 3, extraction="worker", start=2)  # busy: kept
    assert checked == [1, 2, 3]
    assert (late.dropped, late.failures, late.waiting) == (1, 1, 1)
    # Checked (or dropped) up to 2, durably; the busy one is still to be checked.
    assert positions.rows == {LateCaptures.check_row("worker"): 2}


def test_captures_past_the_bound_are_checked_once_the_store_answers(
    backend: Backend, clock: FakeClock
) -> None:
    """Review of decision 0104 (2026-12-05): the bound was a lever. While the audit store
    does not answer, captures keep committing (their own appends fail: each is a lost
    request), and anyone who captures could push the backlog past the bound: the oldest
    batches, the ones holding the outage's first lost requests, were dropped unchecked.
    Past the bound a batch is now kept as its positions only and read again when checked:
    the lost request is recorded once the store answers."""
    kernel = checking_now(backend, clock, projection_batch_size=2)
    try:
        consent(kernel, "alice")
        consent(kernel, "bob")
        killed_after_commit(backend, TEXTS[:2])  # alice's request, lost
        late = late_of(kernel)
        outage = AuditOutage(backend, late)
        late.max_waiting = 4
        kernel.process()  # alice's batch extracted; its check fails
        assert late.failures == 1
        # Another app's flood while the store does not answer.
        for n in range(12):
            kernel.capture("bob", say(f"I collect stamp number {n}"))
            kernel.process()
        assert late.waiting <= 4  # still bounded in memory
        outage.answering = True
        later(late, 120)
        kernel.process()
        lost = [e for e in accepted(kernel) if e.get("reason_code") == LATE]
        assert [e["counts"] for e in lost] == [{"events": 2}]
        assert late.dropped == 0
        assert late.waiting == 0
    finally:
        kernel.close()


@pytest.mark.parametrize(("page", "per_check"), [(2, 10), (3, 1)])
def test_a_lost_request_amid_the_flood_is_named_whole_across_pages(
    backend: Backend,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    page: int,
    per_check: int,
) -> None:
    """The positions kept past the bound are read again a page at a time (a few pages per
    run, the rest at the next runs): a lost request cut by a page's end is still named
    once, whole."""
    monkeypatch.setattr(late_captures, "_SPILLED_PAGE", page)
    monkeypatch.setattr(late_captures, "_SPILLED_PAGES_PER_CHECK", per_check)
    kernel = checking_now(backend, clock, projection_batch_size=2)
    try:
        consent(kernel, "alice")
        consent(kernel, "bob")
        late = late_of(kernel)
        outage = AuditOutage(backend, late)
        late.max_waiting = 2
        for n in range(3):
            kernel.capture("bob", say(f"I collect stamp number {n}"))
            kernel.process()
        killed_after_commit(backend, TEXTS)  # alice's request of three, lost mid-flood
        for n in range(3, 9):
            kernel.capture("bob", say(f"I collect stamp number {n}"))
            kernel.process()
        assert late.failures >= 1 and late.waiting <= 2
        outage.answering = True
        later(late, 600)
        for _ in range(8):  # a run checks ``per_check`` pages at most
            kernel.process()
        lost = [e for e in accepted(kernel) if e.get("reason_code") == LATE]
        assert [e["counts"] for e in lost] == [{"events": 3}]
        assert late.dropped == 0 and late.waiting == 0
        kernel.process()  # nothing is named twice
        assert len([e for e in accepted(kernel) if e.get("reason_code") == LATE]) == 1
    finally:
        kernel.close()
