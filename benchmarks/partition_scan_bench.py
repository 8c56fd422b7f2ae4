"""What reading the whole log costs a partitioned worker (decision 0011 follow-up).

A pipeline worker of partition k of M reads every capture notification of the log in
batches (the topic filter runs in SQL), keeps those whose ``originator_id`` falls in
its partition and decrypts only those. M workers therefore read the log M times. This
bench measures that read, per notification, against the work a worker does per event
anyway (extraction plus projection with the model, from the pipeline bench).

1. Fill a log: ``--subjects`` consenting subjects, ``--captures`` captures in all, in
   batches (no extraction: the scan is over capture notifications, as the extraction
   worker's is).
2. For each M in ``--partitions``, scan the log as partition 0's worker does
   (``notifications_after`` in batches of ``--batch`` from position 0 to the end,
   filter by partition), ``--runs`` times; report seconds per 1,000 notifications
   scanned, and how many the partition kept.
3. For comparison, decode (decrypt) partition 0's notifications: the part of the read
   the worker needs whatever the layout.

Run: ``python -m benchmarks.partition_scan_bench [--backend sqlite|postgres]``
(PostgreSQL from ``UPROF_BENCH_POSTGRES_URL``, in a database it creates and drops).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from eventsourcing.persistence import Notification

from domain.values import Interaction
from uprof.adapters.embeddings import HashingEmbedder
from uprof.bootstrap import bootstrap
from uprof.eventstore import CAPTURED_TOPIC
from uprof.kernel import Uprof
from uprof.partitions import Partitioning
from uprof.settings import Settings

APP = "app:bench"
PURPOSE = "personalization"


@contextmanager
def _database(backend: str) -> Iterator[str | None]:
    """None for SQLite (files in the data folder); a fresh PostgreSQL database's URL."""
    if backend == "sqlite":
        yield None
        return
    admin_url = os.environ.get(
        "UPROF_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    )
    name = f"uprof_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield sa.engine.make_url(admin_url).set(database=name).render_as_string(False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def fill(kernel: Uprof, subjects: int, captures: int) -> None:
    began = datetime(2025, 1, 1, tzinfo=UTC)
    per_subject = captures // subjects
    for s in range(subjects):
        subject = f"subject-{s}"
        kernel.grant_consent(subject, app_id=APP, categories=["*"], purposes=[PURPOSE])
        for first in range(0, per_subject, 500):
            kernel.capture_many(
                subject,
                [
                    Interaction(
                        app_id=APP,
                        agent_id="agent:bench",
                        occurred_at=began + timedelta(minutes=t),
                        user_input=f"I like tea number {t} and I live in town {s}",
                        session_id=f"s{s}-{t // 20}",
                        purpose=PURPOSE,
                    )
                    for t in range(first, min(per_subject, first + 500))
                ],
            )


def scan(kernel: Uprof, partitioning: Partitioning, batch: int) -> tuple[int, list[Notification]]:
    """Read the capture log as partition 0's worker does; (notifications read, kept)."""
    position, read = 0, 0
    kept: list[Notification] = []
    while notifications := kernel.app.notifications_after(
        position, batch, topics=(CAPTURED_TOPIC,)
    ):
        read += len(notifications)
        kept.extend(n for n in notifications if partitioning.of(n.originator_id) == 0)
        position = notifications[-1].id
    return read, kept


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    began = time.perf_counter()
    result = fn()
    return time.perf_counter() - began, result


def _decode_all(kernel: Uprof, notifications: list[Notification]) -> list[Any]:
    return [kernel.app.decode(n) for n in notifications]


def run(
    backend: str, subjects: int, captures: int, partitions: list[int], batch: int, runs: int
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, _database(backend) as url:
        kernel = bootstrap(
            Settings(data_dir=Path(tmp) / "data", database_url=url, embedder="hashing"),
            embedder=HashingEmbedder(),
        )
        try:
            fill_s, _ = _timed(lambda: fill(kernel, subjects, captures))
            rows = {}
            for m in partitions:
                layout = Partitioning(m)
                seconds: list[float] = []
                kept: list[Notification] = []
                for _ in range(runs):
                    took, (read, kept) = _timed(partial(scan, kernel, layout, batch))
                    seconds.append(took)
                decode_s, _ = _timed(partial(_decode_all, kernel, kept))
                per_k = statistics.median(seconds) / read * 1000
                rows[f"M={m}"] = {
                    "notifications_read": read,
                    "kept_by_partition_0": len(kept),
                    "scan_s_runs": [round(s, 3) for s in seconds],
                    "scan_ms_per_1000_read": round(per_k * 1000, 2),
                    "decode_ms_per_1000_kept": round(decode_s / max(1, len(kept)) * 1e6, 2),
                }
        finally:
            kernel.close()
    return {
        "benchmark": "partition_scan",
        "backend": backend,
        "subjects": subjects,
        "captures": captures,
        "batch": batch,
        "runs": runs,
        "fill_s": round(fill_s, 1),
        "rows": rows,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.partition_scan_bench")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--subjects", type=int, default=64)
    parser.add_argument("--captures", type=int, default=64_000)
    parser.add_argument("--partitions", type=int, action="append")
    parser.add_argument("--batch", type=int, default=256, help="the extraction worker's batch size")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = run(
        args.backend,
        args.subjects,
        args.captures,
        args.partitions or [1, 4, 16],
        args.batch,
        args.runs,
    )
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
