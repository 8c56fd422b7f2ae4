"""Eight writer threads on one subject and on many: no lost update, conflicts retried (I12, I11)."""

from __future__ import annotations

import threading

import pytest

from benchmarks.reliability import Target, concurrency_scenario, grant_all, interaction, kernel_on


@pytest.mark.parametrize("subjects", [1, 12])
def test_concurrent_writers_lose_nothing(target: Target, subjects: int) -> None:
    r = concurrency_scenario(target, threads=8, per_thread=6, subjects=subjects)
    # Writers of one subject in one process take turns (ProfilesApplication.with_retry),
    # so none of them may fail, and none collide.
    assert r["errors"] == 0, r["error_samples"]
    assert r["acked"] == r["attempted"] == r["stored"]
    assert r["lost"] == 0 and r["duplicated"] == 0
    assert r["conflicts_retried"] == 0
    assert r["rebuild_equals_live"]


def test_writers_in_two_processes_collide_and_retry_without_loss(target: Target) -> None:
    """Two deployments on one store (their own locks): only the version check keeps
    their writers apart; every collision is retried, and nothing is lost or doubled."""
    with kernel_on(target) as first, kernel_on(target) as second:
        grant_all(first, "alice")
        acked: list[str] = []
        errors: list[str] = []
        conflicts = [0]

        def counted(kernel: object) -> None:
            save = kernel.app.save  # type: ignore[attr-defined]

            def counting_save(*a: object, **kw: object) -> object:
                try:
                    return save(*a, **kw)
                except Exception:
                    conflicts[0] += 1
                    raise

            kernel.app.save = counting_save  # type: ignore[attr-defined]

        counted(first)
        counted(second)

        def write(kernel: object, w: int) -> None:
            for k in range(8):
                try:
                    ack = kernel.capture(  # type: ignore[attr-defined]
                        "alice", interaction(f"I want to do thing {w}-{k}")
                    )
                    acked.append(ack.capture_id)
                except Exception as e:
                    errors.append(f"{type(e).__name__}: {e}"[:200])

        pool = [
            threading.Thread(target=write, args=(kernel, w))
            for w, kernel in enumerate([first, second] * 3)
        ]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        first.process()
        stored = [c.capture_id for c in first.queries.all_captures(str(first.stream_of("alice")))]
    assert errors == [] or all("ConcurrencyConflictError" in e for e in errors)
    assert sorted(acked) == sorted(stored) and len(set(stored)) == len(stored)
    assert len(acked) + len(errors) == 6 * 8
    assert conflicts[0] > 0, "two processes writing one subject never collided"


def test_embedded_process_from_many_threads(target: Target) -> None:
    """Threads calling process() at once must not project a batch twice (bug A, fixed)."""
    errors: list[str] = []
    with kernel_on(target) as kernel:
        names = [f"emb-{i}" for i in range(6)]
        for s in names:
            grant_all(kernel, s)
        barrier = threading.Barrier(len(names))

        def run(subject: str) -> None:
            for k in range(6):
                kernel.capture(subject, interaction(f"I want to do thing {k}"))
                barrier.wait()
                try:
                    kernel.process()
                except Exception as e:
                    errors.append(f"{type(e).__name__}: {e}"[:200])

        pool = [threading.Thread(target=run, args=(s,)) for s in names]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    assert errors == []


def test_exhausted_conflict_retries_surface_as_a_domain_error(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lost races end in a retryable domain error, never a raw store error (bug B, fixed).

    The store's own error (raised where the recorder writes) becomes the typed
    VersionConflictError, the one retry policy tries again, and what escapes is the
    give-up ConcurrencyConflictError (409), not a transient subclass of it.
    """
    from eventsourcing.persistence import IntegrityError as StoreIntegrityError

    from domain.errors import ConcurrencyConflictError, VersionConflictError
    from uprof import retry

    monkeypatch.setattr(
        retry, "SUBJECT_WRITE", retry.RetryPolicy(attempts=2, on=(VersionConflictError,))
    )
    with kernel_on(target) as kernel:
        grant_all(kernel, "alice")
        before = kernel.app.max_notification_id()
        attempts: list[int] = []

        def always_conflicts(*a: object, **kw: object) -> None:
            attempts.append(1)
            raise StoreIntegrityError("another writer saved first")

        monkeypatch.setattr(kernel.app.events, "put", always_conflicts)
        with pytest.raises(ConcurrencyConflictError) as caught:
            kernel.capture("alice", interaction("I want to be retried"))
        assert type(caught.value) is ConcurrencyConflictError
        assert isinstance(caught.value.__cause__, VersionConflictError)
        assert len(attempts) == 2
        assert kernel.app.max_notification_id() == before
