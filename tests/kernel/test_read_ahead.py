"""The projection embeds the next batch while it writes this one (decision 0018).

The batch read ahead is applied only from the position it was read at; otherwise it
is dropped and re-read, so a failed commit or another runner never makes the views
skip or repeat events. Run on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, say, settings_for
from uprof.kernel import Uprof


def _small_batches(backend: Backend, clock: FakeClock) -> Uprof:
    # Batches of 3 notifications: the log below spans many, so most are read ahead.
    settings = settings_for(backend).model_copy(update={"projection_batch_size": 3})
    return build_kernel(settings, clock)


def _fill(kernel: Uprof, days: range) -> None:
    for day in days:
        kernel.capture("alice", say(f"I live in Paris and day {day} was fine", day=day))
        kernel.capture("bob", say(f"I want to climb a mountain on day {day}", day=day))


def _memory_count(kernel: Uprof) -> int:
    return len(kernel.queries.table_digest()["memories"])


def _run_batches(kernel: Uprof) -> None:
    while kernel.process_once():
        pass


def test_read_ahead_projects_what_one_batch_at_a_time_does(
    backend: Backend, clock: FakeClock
) -> None:
    kernel = _small_batches(backend, clock)
    try:
        consent(kernel)
        consent(kernel, subject="bob")
        _fill(kernel, range(1, 8))
        _run_batches(kernel)
        assert kernel.projections.position == kernel.app.max_notification_id()
        live = kernel.queries.table_digest()
        ids, vectors = kernel.queries.embedding_matrix()
        assert _memory_count(kernel) > 10
        assert len(ids) == _memory_count(kernel)  # every memory got its vector
        kernel.projections._embed_ahead = False
        kernel.rebuild()
        assert kernel.queries.table_digest() == live
        rebuilt_ids, rebuilt_vectors = kernel.queries.embedding_matrix()
        assert rebuilt_ids == ids
        assert (abs(rebuilt_vectors - vectors) < 1e-6).all()
    finally:
        kernel.close()


def test_a_batch_that_did_not_commit_drops_the_one_read_after_it(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = _small_batches(backend, clock)
    try:
        consent(kernel)
        consent(kernel, subject="bob")
        _fill(kernel, range(1, 6))
        kernel.extraction.run_until_idle()
        views = kernel.queries  # the view store the runner writes through
        apply = views.apply_batch
        calls = {"n": 0}

        def fail_the_second(*args: Any, **kwargs: Any) -> int:
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("the views database went away")
            return apply(*args, **kwargs)

        monkeypatch.setattr(views, "apply_batch", fail_the_second)
        kernel.projections.run_once()
        with pytest.raises(RuntimeError):
            kernel.projections.run_once()  # the batch read ahead of this one is now stale
        kernel.projections.run_until_idle()
        assert kernel.projections.read_ahead_dropped == 1
        assert kernel.projections.position == kernel.app.max_notification_id()
        live = kernel.queries.table_digest()
        kernel.rebuild()
        assert kernel.queries.table_digest() == live
    finally:
        kernel.close()


def test_read_ahead_of_a_runner_that_lost_the_race_is_dropped(
    backend: Backend, clock: FakeClock
) -> None:
    first = _small_batches(backend, clock)
    second = _small_batches(backend, clock)  # another process on the same database
    try:
        consent(first)
        consent(first, subject="bob")
        _fill(first, range(1, 6))
        first.extraction.run_until_idle()
        first.projections.run_once()  # holds the batch after this one, read ahead
        second.process()  # projects everything meanwhile
        _fill(second, range(6, 9))
        _run_batches(first)
        assert first.projections.read_ahead_dropped >= 1
        assert first.projections.position == first.app.max_notification_id()
        live = first.queries.table_digest()
        assert len(live["captures"]) == 16
        first.rebuild()
        assert first.queries.table_digest() == live
    finally:
        second.close()
        first.close()
