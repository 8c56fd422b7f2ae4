"""A poison capture with several real ``uprof worker`` processes (both backends).

Each worker runs the deployment's own rule-based extractor, patched to raise for any
capture holding ``POISON`` (``tests/kernel/poison.py``; every attempt is appended to a
file, so attempts are counted across processes). On the code before the quarantine,
both workers retried the batch holding the poison for as long as they ran and no capture
after it (of any subject) was extracted or projected: the catch-up below timed out with
every later capture pending. Now each worker gives the capture at most
``retry.EXTRACTOR_CALL``'s attempts, exactly one verdict is recorded (the batch that
commits carries it; the loser's batch rolls back and is re-read), every other capture is
extracted and projected exactly once, in order, and the workers stay up.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.reliability import REPO, Target, grant_all, interaction, open_kernel
from benchmarks.workers_bench import (
    Child,
    _env,
    derived_counts,
    killed_on_failure,
    start_all,
    wait_caught_up,
)
from domain.profile import SubjectProfile
from tests.children import forked_popen
from tests.kernel.poison import MARK
from uprof import retry

CATCH_UP_S = 120.0


def poisoned_worker(
    target: Target, log: Path, partition: int | None, partitions: int, *, exit_at: int = 0
) -> Child:
    """``uprof worker`` (its own entry point, ``uprof.cli.worker.main``) with the rules
    extractor poisoned and its batches counted (``count_batches``); with ``exit_at`` N it
    dies (exit 9, no cleanup) at its N-th attempt on a poison capture."""
    batches = _batches_folder(log)
    batches.mkdir(exist_ok=True)
    entry = [
        "-c",
        "import sys; from tests.kernel.poison import count_batches, patch_rules; "
        f"patch_rules({str(log)!r}); count_batches({str(batches)!r}); "
        "sys.argv[0] = 'uprof-worker'; from uprof.cli.worker import main; main()",
    ]
    args = ["--partitions", str(partitions), "--idle-poll", "0.02", "--log-level", "warning"]
    if partition is not None:
        args += ["--partition", str(partition)]
    env = {**_env(target, partitions), "PYTHONPATH": str(REPO)}
    if exit_at:
        env["UPROF_POISON_EXIT_AT"] = str(exit_at)
    # Forked from the suite's fork server: the same command, a process of its own.
    return Child(args, env, ready="uprof worker ready", entry=entry, launch=forked_popen)


def _batches_folder(log: Path) -> Path:
    return log.with_name("batches")


def _batches_done(log: Path, child: Child) -> int:
    assert child.proc is not None
    mine = _batches_folder(log) / str(child.proc.pid)
    return int(mine.read_text()) if mine.exists() else 0


def until_each_began_a_batch_after_now(log: Path, children: list[Child]) -> None:
    """Until every worker has finished a batch it began after this call. The batch each
    had in hand (a poison's retries, a batch another saved first) is over, and the next
    read the log as it is now: a worker still retrying the poison would have added its
    attempts to ``log`` by then, whatever the load."""
    began = [_batches_done(log, c) + 1 for c in children]  # the one in hand may end first
    deadline = time.monotonic() + CATCH_UP_S
    while any(_batches_done(log, c) <= b for c, b in zip(children, began, strict=True)):
        assert all(c.proc is not None and c.proc.poll() is None for c in children), [
            c.log for c in children
        ]
        assert time.monotonic() < deadline, "a worker finished no batch begun after the catch-up"
        time.sleep(0.02)


def quarantine_events(kernel: Any) -> list[Any]:
    found: list[Any] = []
    position = 0
    while page := kernel.app.notifications_after(position, 500):
        found += [
            e
            for n in page
            if isinstance(e := kernel.app.decode(n), SubjectProfile.CaptureQuarantined)
        ]
        position = page[-1].id
    return found


def run(target: Target, tmp: Path, *, partitions: int, spec: list[int | None]) -> None:
    log = tmp / "attempts.log"
    log.touch()
    kernel = open_kernel(target, worker_partitions=partitions)
    children = [poisoned_worker(target, log, k, partitions) for k in spec]
    try:
        subjects = ["ann", "bea", "cai", "dov"]
        for s in subjects:
            grant_all(kernel, s)
        poisons = []
        for n in range(12):
            subject = subjects[n % len(subjects)]
            kernel.capture(subject, interaction(f"I want to visit the place number {n} soon"))
            if n in (3, 8):
                text = f"I want to visit the {MARK} place number {n} soon"
                poisons.append(kernel.capture(subject, interaction(text)).capture_id)
        with killed_on_failure(children):
            start_all(children)
            # More captures while the workers run, after the poison ones.
            for n in range(12, 20):
                subject = subjects[n % len(subjects)]
                kernel.capture(subject, interaction(f"I want to visit the place number {n} soon"))
            caught_up = wait_caught_up(kernel, CATCH_UP_S)
            until_each_began_a_batch_after_now(log, children)
            exit_codes = [c.sigterm() for c in children]
        assert caught_up, kernel.lag()
        assert exit_codes == [0] * len(children), [c.log for c in children]

        counts = derived_counts(kernel)
        assert counts["captures"] == 22, counts
        assert counts["duplicate"] == 0 and counts["view_duplicate"] == 0, counts
        # Only the poison captures have no memory; every capture is in the captures view.
        assert counts["missing"] == len(poisons) and counts["view_missing"] == len(poisons)
        assert counts["view_captures_missing"] == 0, counts

        assert sorted(q.capture_id for q in kernel.quarantined()) == sorted(poisons)
        events = quarantine_events(kernel)
        assert sorted(e.capture_id for e in events) == sorted(poisons)  # one verdict each
        audited = [
            e.entry["event_ids"][0] for e in kernel.audit_entries(action="capture.quarantined")
        ]
        assert sorted(audited) == sorted(poisons)
        attempts: dict[str, int] = {}
        for line in log.read_text().splitlines():
            capture_id = line.split()[1]
            attempts[capture_id] = attempts.get(capture_id, 0) + 1
        bound = retry.EXTRACTOR_CALL.attempts * len(children)
        assert set(attempts) == set(poisons)
        assert all(0 < a <= bound for a in attempts.values()), attempts
        assert kernel.lag().quarantined == len(poisons)

        live = kernel.queries.table_digest()
        kernel.rebuild()
        assert kernel.queries.table_digest() == live
    finally:
        kernel.close()


def test_two_workers_on_one_position_quarantine_a_poison_capture_once(
    target: Target, tmp_path: Path
) -> None:
    run(target, tmp_path, partitions=1, spec=[None, None])


def test_partitioned_workers_quarantine_a_poison_capture_once(
    target: Target, tmp_path: Path
) -> None:
    run(target, tmp_path, partitions=2, spec=[0, 1, None])


def test_a_worker_killed_mid_retry_leaves_nothing_and_the_next_quarantines_once(
    target: Target, tmp_path: Path
) -> None:
    log = tmp_path / "attempts.log"
    log.touch()
    kernel = open_kernel(target)
    dying = poisoned_worker(target, log, None, 1, exit_at=2)
    survivor = poisoned_worker(target, log, None, 1)
    try:
        grant_all(kernel, "ann")
        kernel.capture("ann", interaction("I want to visit the place number 1 soon"))
        text = f"I want to visit the {MARK} place soon"
        poison = kernel.capture("ann", interaction(text)).capture_id
        kernel.capture("ann", interaction("I want to visit the place number 2 soon"))
        with killed_on_failure([dying, survivor]):
            start_all([dying])
            assert dying.proc is not None
            _, err = dying.proc.communicate(timeout=CATCH_UP_S)
            assert dying.proc.returncode == 9, err[-3000:]  # died at its second attempt
            assert len(log.read_text().splitlines()) == 2
            # Its batch never committed: nothing extracted, nothing quarantined.
            assert kernel.lag().extraction_pending == 3
            assert quarantine_events(kernel) == []
            start_all([survivor])
            caught_up = wait_caught_up(kernel, CATCH_UP_S)
            assert survivor.sigterm() == 0, survivor.log
        assert caught_up, kernel.lag()
        assert [e.capture_id for e in quarantine_events(kernel)] == [poison]
        counts = derived_counts(kernel)
        assert counts["captures"] == 3 and counts["duplicate"] == 0, counts
        assert counts["missing"] == 1 and counts["view_captures_missing"] == 0, counts
        assert len(log.read_text().splitlines()) == 2 + retry.EXTRACTOR_CALL.attempts
        live = kernel.queries.table_digest()
        kernel.rebuild()
        assert kernel.queries.table_digest() == live
    finally:
        dying.kill_if_running()
        survivor.kill_if_running()
        kernel.close()
