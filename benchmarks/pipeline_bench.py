"""Extraction + projection throughput per worker process, on LoCoMo dev turns with MiniLM.

The log is filled first (not timed): every turn of the first ``--conversations``
LoCoMo dev conversations, one subject per speaker (so subjects spread over
partitions), captured through the kernel with the real data (read in place from
the shared bench folder, never copied). Then W worker processes, each running one
partition of W (the loop of ``uprof worker``: ``Uprof.process_once`` until caught
up), load the real all-MiniLM-L6-v2 embedder and the rules extractor, report READY,
and start together on a GO line. Each stops when its partition has extracted every
capture and projected the whole log; the run's time is the slowest worker's.

Figures: captures (turns) fully extracted and projected per second, in all and per
worker, and log events per second (the unit of docs/performance.md: every event of the
final log, captures and the events extracted from them, went through a projection).
Each worker also reports the CPU seconds its process used (all its threads; a
PostgreSQL server's work is not in them), which a busy shared machine inflates far less
than wall time. Medians of ``--repeat`` runs, each on a fresh copy of the filled log.

The baseline beside them: with ``--compare-tree DIR`` (a checkout of older code, e.g.
``git worktree add /tmp/base <commit>``), every configuration's runs alternate between
this tree's code and DIR's, on copies of the same filled log, so both see the same load;
the workers then run this file's child loop over DIR's ``uprof``. Without it, one worker
with torch's default thread count (what the code did before ``UPROF_TORCH_THREADS``).

    uprof bench pipeline --backend postgres --workers 1 --workers 2
    python -m benchmarks.pipeline_bench --backend sqlite --conversations 2
    python -m benchmarks.pipeline_bench --compare-tree /tmp/base --conversations 3 \
        --turns-per-subject 70 --workers 1 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.uprof_system import bench_authorizer, bench_interaction

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "docs" / "bench" / "pipeline.json"
POSTGRES_ADMIN_URL = os.environ.get(
    "UPROF_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)

APP = "app:bench"
AGENT = "agent:bench"
PURPOSE = "benchmark"


def _settings(data_dir: Path, url: str | None, **kw: Any) -> Any:
    from uprof.settings import Settings

    return Settings(data_dir=data_dir, database_url=url, **kw)


# ------------------------------------------------------------------------ child


def child(argv: Sequence[str]) -> int:
    """One worker: bootstrap (real embedder from the settings), READY, wait for GO, run."""
    from uprof.bootstrap import bootstrap, build_embedder
    from uprof.eventstore import CAPTURED_TOPIC
    from uprof.partitions import Partitioning

    p = argparse.ArgumentParser()
    p.add_argument("--data-dir", required=True)
    p.add_argument("--database-url", default=None)
    p.add_argument("--partitions", type=int, required=True)
    p.add_argument("--partition", type=int, required=True)
    p.add_argument("--torch-threads", type=int, required=True)
    args = p.parse_args(argv)
    settings = _settings(
        Path(args.data_dir),
        args.database_url,
        worker_partitions=args.partitions,
        torch_threads=args.torch_threads,
        embedder="minilm",
        extractor="rules",
    )
    embedder = build_embedder(settings)
    embedder.embed(["a first call warms torch up"])
    kernel = bootstrap(
        settings, embedder=embedder, partitions=[args.partition], authorizer=bench_authorizer()
    )
    app = kernel.app
    captures = app.notifications_after(0, 10**9, topics=(CAPTURED_TOPIC,))
    last_capture = captures[-1].id
    of = Partitioning(args.partitions).of
    mine = sum(1 for n in captures if of(n.originator_id) == args.partition)
    print("READY", flush=True)
    if sys.stdin.readline().strip() != "GO":
        return 2
    began = time.perf_counter()
    cpu_began = time.process_time()
    processed = 0
    k = args.partition
    while True:
        n = kernel.process_once()
        processed += n
        if n:
            continue
        extracted = all(
            kernel.extraction.partition_position(j) >= last_capture for j in range(args.partitions)
        )
        if extracted and kernel.projections.partition_position(k) >= app.max_notification_id():
            break
        time.sleep(0.01)
    elapsed = time.perf_counter() - began
    cpu = time.process_time() - cpu_began
    log_end = app.max_notification_id()
    result = {"elapsed_s": elapsed, "cpu_s": cpu, "consumed": processed, "log_end": log_end}
    print(json.dumps({**result, "partition_captures": mine}), flush=True)
    kernel.close()
    return 0


# --------------------------------------------------------------------- orchestration


@contextmanager
def _database(kind: str, template: str | None = None) -> Iterator[str | None]:
    if kind == "sqlite":
        yield None
        return
    import sqlalchemy as sa

    name = f"uprof_pipe_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            extra = f' TEMPLATE "{template}"' if template else ""
            conn.execute(sa.text(f'CREATE DATABASE "{name}"{extra}'))
        yield (
            sa.engine.make_url(POSTGRES_ADMIN_URL)
            .set(database=name)
            .render_as_string(hide_password=False)
        )
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def fill(
    data_dir: Path, url: str | None, conversations: int, partitions: int, turns_cap: int = 0
) -> dict[str, int]:
    """Capture the LoCoMo turns (one subject per speaker); nothing is processed.
    ``turns_cap``: at most this many turns per subject (0: all)."""
    from benchmarks.bench_common import DEFAULT_DATA_DIR
    from benchmarks.locomo import load_locomo, subjects_for_mode
    from uprof.adapters.embeddings import HashingEmbedder
    from uprof.bootstrap import bootstrap

    convs = load_locomo(REPO / DEFAULT_DATA_DIR / "locomo_dev.json")[:conversations]
    kernel = bootstrap(
        _settings(data_dir, url, worker_partitions=partitions, embedder="hashing"),
        embedder=HashingEmbedder(),
        authorizer=bench_authorizer(),
    )
    turns = 0
    try:
        for conv in convs:
            for subject, subject_turns in subjects_for_mode(conv, "P").items():
                kernel.grant_consent(subject, app_id=APP, categories=["*"], purposes=[PURPOSE])
                batch = [
                    bench_interaction(t)
                    for t in (subject_turns[:turns_cap] if turns_cap else subject_turns)
                ]
                for lo in range(0, len(batch), 500):
                    kernel.capture_many(subject, batch[lo : lo + 500])
                turns += len(batch)
        return {"captures": turns, "log_events": kernel.app.max_notification_id()}
    finally:
        kernel.close()


def _copy_sqlite(src: Path, dst: Path) -> None:
    """Copy a closed deployment folder; the databases through the SQLite backup API."""
    import sqlite3

    dst.mkdir(parents=True)
    for item in src.iterdir():
        if item.suffix == ".sqlite":
            with sqlite3.connect(item) as source, sqlite3.connect(dst / item.name) as target:
                source.backup(target)
            source.close()
            target.close()
        elif item.is_file() and not item.name.endswith(("-wal", "-shm")):
            shutil.copy2(item, dst / item.name)


def _child_command(tree: Path | None) -> tuple[list[str], Path]:
    """The worker command and its folder: this tree's, or this file's child loop run
    over another tree's code (imports resolve from that folder first)."""
    if tree is None:
        return [sys.executable, "-m", "benchmarks.pipeline_bench", "--child"], REPO
    here = Path(__file__).resolve()
    run = (
        "import runpy, sys; sys.argv = [sys.argv[0], '--child', *sys.argv[1:]]; "
        f"runpy.run_path({str(here)!r}, run_name='__main__')"
    )
    return [sys.executable, "-c", run], tree


def one_run(
    kind: str,
    sizes: dict[str, int],
    template_dir: Path,
    template_db: str | None,
    workers: int,
    threads: int,
    tree: Path | None = None,
) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="uprof-pipe-run-") as tmp,
        _database(kind, template_db) as url,
    ):
        data = Path(tmp) / "data"
        if kind == "sqlite":
            _copy_sqlite(template_dir, data)
        elif template_dir.exists():  # on PostgreSQL the folder may hold nothing at all
            shutil.copytree(template_dir, data)
        # The key folder sits beside the data folder (decision 0012). Without it a copy
        # has a fresh master key, cannot open any subject's keys and extracts nothing.
        _copy_sqlite(_settings(template_dir, None).key_path, _settings(data, None).key_path)
        base, cwd = _child_command(tree)
        env = {**os.environ, "PYTHONPATH": str(cwd), "HF_HUB_OFFLINE": "1"}
        procs = []
        for k in range(workers):
            cmd = [*base, "--data-dir", str(data), "--partitions", str(workers)]
            cmd += ["--partition", str(k)]
            cmd += ["--torch-threads", str(threads)]
            if url:
                cmd += ["--database-url", url]
            proc = subprocess.Popen(
                cmd, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            # One at a time: two processes opening a PostgreSQL log at once can collide in
            # eventsourcing's create_table ("tuple concurrently updated"; docs/reliability.md).
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != "READY":
                raise RuntimeError(f"worker did not start: {line!r}")
            procs.append(proc)
        load = os.getloadavg()[0]
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("GO\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=3600)
            results.append(json.loads(out.strip().splitlines()[-1]))
            if proc.returncode != 0:
                raise RuntimeError(f"worker exited with {proc.returncode}")
        if max(r["log_end"] for r in results) <= sizes["log_events"]:
            raise RuntimeError("the workers extracted nothing: the run measured no work")
        return {
            "elapsed_s": max(r["elapsed_s"] for r in results),
            "cpu_s": sum(r["cpu_s"] for r in results),
            "log_end": max(r["log_end"] for r in results),
            "partition_captures": [r["partition_captures"] for r in results],
            "load_1min_at_go": load,
        }


def _row(w: int, threads: int, sizes: dict[str, int], runs: list[dict[str, Any]]) -> dict[str, Any]:
    elapsed = statistics.median(r["elapsed_s"] for r in runs)
    cpu = statistics.median(r["cpu_s"] for r in runs)
    events = runs[0]["log_end"]
    return {
        "workers": w,
        "torch_threads": threads or "default",
        **sizes,
        "median_s": round(elapsed, 2),
        "captures_per_s": round(sizes["captures"] / elapsed, 1),
        "captures_per_s_per_worker": round(sizes["captures"] / elapsed / w, 1),
        "log_events_after": events,
        "events_per_s": round(events / elapsed, 1),
        "events_per_s_per_worker": round(events / elapsed / w, 1),
        "median_cpu_s_all_workers": round(cpu, 2),
        "events_per_cpu_s": round(events / cpu, 1),
        "runs_s": [round(r["elapsed_s"], 2) for r in runs],
        "runs_cpu_s": [round(r["cpu_s"], 2) for r in runs],
        "partition_captures": runs[0]["partition_captures"],
        "load_1min_at_go": [round(r["load_1min_at_go"], 2) for r in runs],
    }


def measure(
    kind: str,
    *,
    conversations: int,
    workers: Sequence[int],
    repeat: int,
    turns_cap: int = 0,
    compare_tree: Path | None = None,
) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    configs = [] if compare_tree else [(1, 0, "baseline: 1 worker, torch default threads")]
    configs += [(w, 1, f"{w} worker(s), 1 torch thread each") for w in workers]
    for w, threads, label in configs:
        with tempfile.TemporaryDirectory(prefix="uprof-pipe-") as tmp, _database(kind) as url:
            template = Path(tmp) / "data"
            sizes = fill(template, url, conversations, w, turns_cap)
            template_db = None
            if url is not None:
                import sqlalchemy as sa

                template_db = sa.engine.make_url(url).database
            runs: list[dict[str, Any]] = []
            base_runs: list[dict[str, Any]] = []
            for _ in range(repeat):
                runs.append(one_run(kind, sizes, template, template_db, w, threads))
                if compare_tree is not None:
                    base_runs.append(
                        one_run(kind, sizes, template, template_db, w, threads, tree=compare_tree)
                    )
        rows[label] = _row(w, threads, sizes, runs)
        if base_runs:
            base = _row(w, threads, sizes, base_runs)
            rows[f"baseline tree: {label}"] = base
            rows[label]["ratio_to_baseline_tree"] = {
                "events_per_s": round(rows[label]["events_per_s"] / base["events_per_s"], 2),
                "events_per_cpu_s": round(
                    rows[label]["events_per_cpu_s"] / base["events_per_cpu_s"], 2
                ),
            }
        print(json.dumps({kind: {k: v for k, v in rows.items() if label in k}}), flush=True)
    return rows


def _commit_of(tree: Path | None) -> str | None:
    if tree is None:
        return None
    out = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return out.stdout.strip() or None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        return child(argv[1:])
    p = argparse.ArgumentParser(prog="python -m benchmarks.pipeline_bench", description=__doc__)
    p.add_argument("--backend", action="append", choices=["sqlite", "postgres"])
    p.add_argument("--conversations", type=int, default=2)
    p.add_argument("--workers", type=int, action="append")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--turns-per-subject", type=int, default=0, help="0: all")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument(
        "--compare-tree",
        type=Path,
        default=None,
        help="a checkout of older code: its runs alternate with this tree's (the baseline)",
    )
    p.add_argument("--label", default="", help="suffix of the result keys (default: none)")
    args = p.parse_args(argv)
    results: dict[str, Any] = {}
    if args.out.exists():
        try:
            results = json.loads(args.out.read_text())
        except ValueError:
            results = {}
    for kind in args.backend or ["postgres", "sqlite"]:
        rows = measure(
            kind,
            conversations=args.conversations,
            workers=args.workers or [1, 2],
            repeat=args.repeat,
            turns_cap=args.turns_per_subject,
            compare_tree=args.compare_tree,
        )
        results[f"{kind}-{args.label}" if args.label else kind] = {
            "rows": rows,
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "cpus": os.cpu_count(),
            "command": f"python -m benchmarks.pipeline_bench --backend {kind} "
            f"--conversations {args.conversations} "
            + " ".join(f"--workers {w}" for w in args.workers or [1, 2])
            + f" --repeat {args.repeat} --turns-per-subject {args.turns_per_subject}"
            + (" --compare-tree <checkout of the baseline commit>" if args.compare_tree else ""),
            "baseline_tree_commit": _commit_of(args.compare_tree),
            "load_average_at_end": os.getloadavg(),
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
