"""The deployment's rate-limit counters (``uprof.services.rate_limits``), SQLite and
PostgreSQL: atomic across real processes, a moving window, a hit over one limit counted
against none, bounded storage, and a refusal (never a pass) when the store cannot answer."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from domain.errors import RateLimitUnavailableError
from tests import children
from tests.conftest import Backend
from uprof.services.rate_limits import SLOTS, RateCounters, RateLimiter, bucket_of
from uprof.settings import parse_rate_limit
from uprof.storage import create_engine

PROCESSES = 4
HITS_EACH = 10
ALLOWED = 15


def _views_url(backend: Backend) -> str:
    if backend.kind == "postgres":
        return backend.url
    return f"sqlite:///{backend.data_dir / 'data' / 'views.sqlite'}"


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def engine(backend: Backend) -> sa.Engine:
    made = create_engine(_views_url(backend))
    yield made
    made.dispose()


def _hits(url: str, barrier: object, results: object) -> None:
    try:
        from uprof.services.rate_limits import RateCounters, bucket_of
        from uprof.settings import parse_rate_limit
        from uprof.storage import create_engine

        engine = create_engine(url)
        counters = RateCounters(engine)
        limits = parse_rate_limit(f"{ALLOWED}/hour")
        barrier.wait(120)  # type: ignore[attr-defined]
        allowed = sum(
            counters.hit(bucket_of("test", "shared"), limits) is None for _ in range(HITS_EACH)
        )
        engine.dispose()
        results.put(allowed)  # type: ignore[attr-defined]
    except Exception as error:
        results.put(f"{type(error).__name__}: {str(error)[:300]}")  # type: ignore[attr-defined]


def test_processes_hitting_one_bucket_at_once_are_allowed_the_limit_exactly(
    backend: Backend,
) -> None:
    context = children.CONTEXT
    barrier, results = context.Barrier(PROCESSES), context.Queue()
    processes = [
        context.Process(target=_hits, args=(_views_url(backend), barrier, results))
        for _ in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=300) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    assert all(isinstance(o, int) for o in outcomes), outcomes
    assert sum(outcomes) == ALLOWED, outcomes  # 40 hits at once, 15 allowed, not one more


def test_the_window_moves_and_the_refusal_says_when(engine: sa.Engine) -> None:
    clock = _Clock(1_000_000.0)
    counters = RateCounters(engine, clock=clock)
    limits = parse_rate_limit("3/minute")
    bucket = bucket_of("test", "k")
    for at in (0.0, 10.0, 20.0):
        clock.now = 1_000_000.0 + at
        assert counters.hit(bucket, limits) is None
    clock.now = 1_000_030.0
    refused = counters.hit(bucket, limits)
    assert refused is not None
    # The first hit's slot (a second long) leaves the window a minute and a slot later.
    assert refused.until == 1_000_000.0 + 60 + 60 / SLOTS
    assert refused.retry_after_s == pytest.approx(31.0)
    clock.now = refused.until - 0.001
    assert counters.hit(bucket, limits) is not None
    clock.now = refused.until
    assert counters.hit(bucket, limits) is None  # the window moved past the first hit
    assert counters.hit(bucket_of("test", "other"), limits) is None  # another bucket: its own


def test_a_hit_over_one_limit_is_counted_against_none(engine: sa.Engine) -> None:
    clock = _Clock(2_000_000.0)
    counters = RateCounters(engine, clock=clock)
    limits = parse_rate_limit("2/minute;3/hour")
    bucket = bucket_of("test", "k")
    assert counters.hit(bucket, limits) is None
    assert counters.hit(bucket, limits) is None
    refused = counters.hit(bucket, limits)
    assert refused is not None and str(refused.limit) == "2 per 1 minute"
    clock.now += 62
    # Had the refused hit counted in the hour, this third one would be over 3/hour.
    assert counters.hit(bucket, limits) is None
    clock.now += 62
    refused = counters.hit(bucket, limits)
    assert refused is not None and str(refused.limit) == "3 per 1 hour"


def test_expired_slots_are_deleted(engine: sa.Engine) -> None:
    clock = _Clock(3_000_000.0)
    counters = RateCounters(engine, clock=clock, prune_every_s=0)
    limits = parse_rate_limit("5/second;100/minute")
    for n in range(50):
        clock.now = 3_000_000.0 + n * 0.5
        counters.hit(bucket_of("test", f"k{n % 7}"), limits)
    assert counters.rows() > 14
    clock.now += 62  # every slot has left its window
    counters.hit(bucket_of("test", "fresh"), limits)
    assert counters.rows() == 2  # the fresh bucket's slot of each period, nothing else


def test_a_store_that_does_not_answer_refuses(backend: Backend, tmp_path: Path) -> None:
    url = (
        "postgresql+psycopg://postgres@127.0.0.1:1/nowhere?connect_timeout=2"
        if backend.kind == "postgres"
        else f"sqlite:///{tmp_path / 'no-such-folder' / 'views.sqlite'}"
    )
    broken = create_engine(url)
    try:
        with pytest.raises(RateLimitUnavailableError):
            RateCounters(broken).hit(bucket_of("test", "k"), parse_rate_limit("5/minute"))
    finally:
        broken.dispose()


def test_a_refused_key_is_refused_from_memory_until_its_time_then_asked_again(
    backend: Backend, engine: sa.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limiter keeps one thing in process memory: a refusal, until the time the
    database named (before it, no process can allow the key)."""
    clock = _Clock(4_000_000.0)
    counters = RateCounters(engine, clock=clock)
    limiter = RateLimiter(parse_rate_limit("2/minute"), counters, "test", clock=clock)
    assert limiter.check("k") is None
    assert limiter.check("k") is None
    refused = limiter.check("k")
    assert refused is not None
    broken_url = (
        "postgresql+psycopg://postgres@127.0.0.1:1/nowhere?connect_timeout=2"
        if backend.kind == "postgres"
        else f"sqlite:///{tmp_path / 'no-such-folder' / 'views.sqlite'}"
    )
    broken = create_engine(broken_url)
    monkeypatch.setattr(counters, "_engine", broken)
    try:
        clock.now = refused.until - 1
        again = limiter.check("k")  # the database is not asked
        assert again is not None and again.until == refused.until
        assert again.retry_after_s == pytest.approx(1.0)
        clock.now = refused.until
        with pytest.raises(RateLimitUnavailableError):  # asked again, and it cannot answer
            limiter.check("k")
    finally:
        broken.dispose()


def test_a_hit_counted_is_allowed_even_if_the_housekeeping_after_it_fails(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deletion of every bucket's expired rows runs after the hit's commit: a failure
    there must not refuse (503) a hit already counted, nor spend the caller's allowance
    on a refusal."""
    counters = RateCounters(engine, prune_every_s=0)
    limits = parse_rate_limit("2/minute")

    def fails() -> None:
        raise sa.exc.OperationalError("DELETE", {}, Exception("database is locked"))

    monkeypatch.setattr(engine, "begin", fails)
    assert counters.hit(bucket_of("test", "k"), limits) is None
    assert counters.hit(bucket_of("test", "k"), limits) is None
    assert counters.hit(bucket_of("test", "k"), limits) is not None  # both were counted
