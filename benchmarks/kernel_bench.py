"""Kernel benchmarks: capture throughput and latency, extraction + projection, rebuild.

Run from the CLI: ``uprof bench kernel [--backend sqlite|postgres] [--quick]``.
Every figure is a median over repeated runs; capture throughput is reported
beside a baseline (the same events through a plain eventsourcing application
without per-subject encryption) run in the same process, as a ratio.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event

from domain.values import Interaction
from projections.profile.views import SqlViewStore
from uprof.bootstrap import bootstrap
from uprof.kernel import Uprof
from uprof.settings import Settings
from uprof.storage import layout_for

APP = "app:bench"
SENTENCES = (
    "I live in Porto and I work as a nurse.",
    "I love hiking in the mountains on weekends.",
    "I want to learn to play the cello this year.",
    "My daughter Ana starts school in September.",
    "I'm vegetarian, so no meat recipes please.",
    "We talked about the budget for the kitchen renovation.",
    "Every Monday I go to the gym at 6pm.",
    "I have a cat named Miso who sleeps all day.",
)


def interaction(i: int, start: datetime) -> Interaction:
    return Interaction(
        app_id=APP,
        agent_id="agent:bench",
        occurred_at=start + timedelta(seconds=i),
        user_input=f"{SENTENCES[i % len(SENTENCES)]} (turn {i})",
        session_id=f"s{i // 50}",
        source_ref=f"B:{i}",
        sharing="shared",
    )


@contextmanager
def deployment(backend: str, *, embedder: str = "hashing", **overrides: Any) -> Iterator[Uprof]:
    """A throwaway deployment on SQLite files or a fresh PostgreSQL database."""
    tmp = Path(tempfile.mkdtemp(prefix="uprof-bench-"))
    pg_name = ""
    admin_url = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    url = None
    if backend == "postgres":
        pg_name = f"uprof_bench_{uuid.uuid4().hex[:10]}"
        admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{pg_name}"'))
        admin.dispose()
        url = sa.engine.make_url(admin_url).set(database=pg_name).render_as_string(False)
    settings = Settings(data_dir=tmp / "data", database_url=url, embedder=embedder)
    from benchmarks.uprof_system import bench_authorizer

    overrides.setdefault("authorizer", bench_authorizer(("personalization",)))
    k = bootstrap(settings, **overrides)
    try:
        yield k
    finally:
        k.close()
        shutil.rmtree(tmp, ignore_errors=True)
        if pg_name:
            admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)'))
            admin.dispose()


def grant(k: Uprof, subject: str) -> None:
    k.grant_consent(subject, app_id=APP, categories=["*"], purposes=["personalization"])


def capture_batched(k: Uprof, subject: str, n: int, batch: int, offset: int = 0) -> float:
    """Capture n interactions in batches; return events per second."""
    start = datetime(2025, 1, 1, tzinfo=UTC)
    began = time.perf_counter()
    for lo in range(0, n, batch):
        k.capture_many(
            subject, [interaction(offset + i, start) for i in range(lo, min(n, lo + batch))]
        )
    return n / (time.perf_counter() - began)


def single_capture_p50_ms(k: Uprof, subject: str, samples: int, offset: int) -> float:
    start = datetime(2025, 1, 1, tzinfo=UTC)
    timings = []
    for i in range(samples):
        began = time.perf_counter()
        k.capture(subject, interaction(offset + i, start))
        timings.append((time.perf_counter() - began) * 1000)
    return statistics.median(timings)


# ---- baseline: plain eventsourcing, no encryption, no consent gate -------------------


class PlainLog(Aggregate):
    @event("Opened")
    def __init__(self) -> None:
        self.n = 0

    @event("Captured")
    def captured(self, text: str, occurred_at: datetime, source_ref: str) -> None:
        self.n += 1


class PlainApp(Application[UUID]):
    name = "plainbench"


def baseline_batched(backend_env: dict[str, str], n: int, batch: int) -> float:
    app = PlainApp(env=backend_env)
    try:
        log = PlainLog()
        app.save(log)
        start = datetime(2025, 1, 1, tzinfo=UTC)
        began = time.perf_counter()
        for lo in range(0, n, batch):
            for i in range(lo, min(n, lo + batch)):
                it = interaction(i, start)
                log.captured(
                    text=it.user_input, occurred_at=it.occurred_at, source_ref=it.source_ref
                )
            app.save(log)
        return n / (time.perf_counter() - began)
    finally:
        app.close()


def baseline_env(k: Uprof) -> dict[str, str]:
    env = dict(layout_for(k.settings).eventsourcing_env)
    if env["PERSISTENCE_MODULE"] == "eventsourcing.sqlite":
        env["SQLITE_DBNAME"] = str(Path(env["SQLITE_DBNAME"]).with_name("baseline.sqlite"))
    return env


# ---- the figures -------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    batched: int
    small_history: int
    large_history: int
    latency_samples: int
    pipeline_events: int
    rebuild_events: int
    repeats: int


FULL = Sizes(20_000, 1_000, 100_000, 300, 2_000, 50_000, 3)
QUICK = Sizes(2_000, 200, 5_000, 50, 200, 2_000, 1)


def measure_capture(backend: str, sizes: Sizes) -> dict[str, Any]:
    uprof_rates, base_rates = [], []
    for _ in range(sizes.repeats):
        with deployment(backend) as k:
            grant(k, "bench")
            uprof_rates.append(capture_batched(k, "bench", sizes.batched, 1_000))
            base_rates.append(baseline_batched(baseline_env(k), sizes.batched, 1_000))
    with deployment(backend) as k:
        grant(k, "small")
        grant(k, "large")
        capture_batched(k, "small", sizes.small_history, 1_000)
        capture_batched(k, "large", sizes.large_history, 2_000)
        p50_small = statistics.median(
            single_capture_p50_ms(k, "small", sizes.latency_samples, 10_000_000)
            for _ in range(sizes.repeats)
        )
        p50_large = statistics.median(
            single_capture_p50_ms(k, "large", sizes.latency_samples, 20_000_000)
            for _ in range(sizes.repeats)
        )
    uprof_rate = statistics.median(uprof_rates)
    base_rate = statistics.median(base_rates)
    return {
        "backend": backend,
        "batched_events": sizes.batched,
        "batched_events_per_s": round(uprof_rate),
        "baseline_plain_eventsourcing_events_per_s": round(base_rate),
        "ratio_uprof_to_baseline": round(uprof_rate / base_rate, 3),
        "single_capture_p50_ms": {
            f"history_{sizes.small_history}": round(p50_small, 3),
            f"history_{sizes.large_history}": round(p50_large, 3),
            "ratio_large_to_small": round(p50_large / p50_small, 3),
        },
    }


def measure_pipeline(backend: str, sizes: Sizes, embedder: str) -> dict[str, Any]:
    rates = []
    for _ in range(sizes.repeats):
        with deployment(backend, embedder=embedder) as k:
            grant(k, "bench")
            capture_batched(k, "bench", sizes.pipeline_events, 500)
            if embedder == "minilm":
                _views(k).projector.embed_memories([])
                _warm(k)
            began = time.perf_counter()
            k.process()
            rates.append(sizes.pipeline_events / (time.perf_counter() - began))
    return {
        "backend": backend,
        "embedder": embedder,
        "events": sizes.pipeline_events,
        "extraction_plus_projection_events_per_s": round(statistics.median(rates), 1),
    }


def _views(k: Uprof) -> SqlViewStore:
    """The SQL view store behind the port: the projector and the digests are its own."""
    views = k.queries
    assert isinstance(views, SqlViewStore)
    return views


def _warm(k: Uprof) -> None:
    embed = getattr(_views(k).projector, "_embedder", None)
    if embed is not None:
        embed.embed(["warm up"])


def measure_rebuild(backend: str, sizes: Sizes) -> dict[str, Any]:
    with deployment(backend) as k:
        grant(k, "bench")
        grant(k, "other")
        capture_batched(k, "bench", sizes.rebuild_events // 4, 1_000)
        capture_batched(k, "other", sizes.rebuild_events // 4, 1_000, offset=10**7)
        k.process()
        total_events = k.app.max_notification_id()
        views = _views(k)
        live = views.table_digest()
        live_ids, live_vectors = views.embedding_matrix()
        rates = []
        for _ in range(sizes.repeats):
            began = time.perf_counter()
            k.rebuild()
            rates.append(total_events / (time.perf_counter() - began))
        rebuilt = views.table_digest()
        ids, vectors = views.embedding_matrix()
        equal = (
            rebuilt == live and ids == live_ids and bool((abs(vectors - live_vectors) < 1e-6).all())
        )
    return {
        "backend": backend,
        "log_events": total_events,
        "rebuild_events_per_s": round(statistics.median(rates)),
        "rebuilt_equals_live": equal,
    }


PARTS = ("capture", "pipeline", "rebuild")


def run(
    backend: str, *, quick: bool, embedder: str, parts: tuple[str, ...] = PARTS
) -> dict[str, Any]:
    sizes = QUICK if quick else FULL
    measured = {
        "capture": lambda: measure_capture(backend, sizes),
        "pipeline": lambda: measure_pipeline(backend, sizes, embedder),
        "rebuild": lambda: measure_rebuild(backend, sizes),
    }
    result: dict[str, Any] = {"sizes": sizes.__dict__}
    for part in parts:
        result[part] = measured[part]()
        result[part]["measured_at"] = datetime.now(tz=UTC).isoformat(timespec="seconds")
    return result


def main(
    backend: str,
    out: Path,
    quick: bool,
    embedder: str,
    echo: Callable[[str], None],
    parts: tuple[str, ...] = PARTS,
) -> dict[str, Any]:
    """Measure the parts asked for; parts not re-measured keep their earlier figures in out."""
    fresh = run(backend, quick=quick, embedder=embedder, parts=parts)
    result = json.loads(out.read_text(encoding="utf-8")) if out.exists() else {}
    result.update(fresh)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    echo(json.dumps(result, indent=2))
    return result
