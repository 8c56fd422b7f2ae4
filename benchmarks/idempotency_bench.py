"""What an Idempotency-Key costs a capture: keyed vs unkeyed, side by side, per backend.

Run: ``python -m benchmarks.idempotency_bench [--backend sqlite|postgres] [--n 300]
[--runs 3]`` (PostgreSQL from ``UPROF_BENCH_POSTGRES_URL``, a database it creates and
drops). Prints JSON: per run, the median and p95 latency (ms) of one kernel capture
as AppScope makes it, without a key (the baseline) and with a fresh key each time, and
of a replay (same key again); then the medians over the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from domain.values import Interaction
from uprof.adapters.embeddings import HashingEmbedder
from uprof.bootstrap import bootstrap
from uprof.kernel import Uprof
from uprof.settings import Settings

APP = "app:bench"


def _interaction(i: int) -> Interaction:
    return Interaction(
        app_id=APP,
        agent_id="agent:bench",
        occurred_at=datetime(2025, 1, 1, tzinfo=UTC),
        user_input=f"I like tea number {i}",
        session_id=f"s{i // 20}",
        source_ref=f"r{i}",
        purpose="personalization",
    )


def _timed(fn: Any) -> float:
    began = time.perf_counter()
    fn()
    return (time.perf_counter() - began) * 1000


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered), 3),
        "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))], 3),
    }


def one_run(kernel: Uprof, n: int, subject: str) -> dict[str, Any]:
    kernel.grant_consent(subject, app_id=APP, categories=["*"], purposes=["personalization"])
    plain, keyed, replay = [], [], []
    for i in range(n):  # interleaved, so load on the machine hits both alike
        plain.append(_timed(lambda i=i: kernel.capture(subject, _interaction(i))))
        key = f"k-{subject}-{i}"

        def keyed_capture(key: str = key, i: int = i) -> Any:
            return kernel.idempotent(
                APP,
                key,
                "capture",
                {"i": i},
                lambda t: (asdict(kernel.capture(subject, _interaction(i), request_token=t)), 201),
            )

        keyed.append(_timed(keyed_capture))
        replay.append(_timed(keyed_capture))
    return {"unkeyed": _summary(plain), "keyed": _summary(keyed), "replay": _summary(replay)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url, drop = None, None
        if args.backend == "postgres":
            admin_url = os.environ.get(
                "UPROF_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
            )
            name = f"uprof_bench_{uuid.uuid4().hex[:10]}"
            admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
            url = sa.engine.make_url(admin_url).set(database=name).render_as_string(False)

            def drop() -> None:
                with admin.connect() as conn:
                    conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                admin.dispose()

        kernel = bootstrap(
            Settings(data_dir=Path(tmp) / "data", database_url=url, embedder="hashing"),
            embedder=HashingEmbedder(),
        )
        try:
            runs = [one_run(kernel, args.n, f"subject-{r}") for r in range(args.runs)]
        finally:
            kernel.close()
            if drop is not None:
                drop()
    medians = {
        kind: round(statistics.median(r[kind]["median_ms"] for r in runs), 3)
        for kind in ("unkeyed", "keyed", "replay")
    }
    print(
        json.dumps(
            {
                "backend": args.backend,
                "n": args.n,
                "runs": runs,
                "median_of_medians_ms": medians,
                "load_avg": os.getloadavg(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
